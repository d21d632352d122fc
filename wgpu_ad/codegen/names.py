"""Readable, valid, unique WGSL identifiers from the user's variable and field names."""
from __future__ import annotations

import re

# WGSL keywords and reserved words (WGSL spec, "Keyword and Reserved Word Summary")
_KEYWORDS = """
alias break case const const_assert continue continuing default diagnostic discard else enable
false fn for if let loop override requires return struct switch true var while
NULL Self abstract active alignas alignof as asm asm_fragment async attribute auto await become
binding_array cast catch class co_await co_return co_yield coherent column_major common compile
compile_fragment concept const_cast consteval constexpr constinit crate debugger decltype delete
demote demote_to_helper do dynamic_cast enum explicit export extends extern external fallthrough
filter final finally friend from fxgroup get goto groupshared highp impl implements import inline
instanceof interface layout lowp macro macro_rules match mediump meta mod module move mut mutable
namespace new nil noexcept noinline nointerpolation noperspective null nullptr of operator package
packoffset partition pass patch pixelfragment precise precision premerge priv protected pub public
readonly ref regardless register reinterpret_cast require resource restrict self set shared sizeof
smooth snorm static static_assert static_cast std subroutine super target template this
thread_local throw trait try type typedef typeid typename typeof union unless unorm unsafe unsized
use using varying virtual volatile wgsl where with writeonly yield
"""
# predeclared types and builtin functions: legal to shadow, but a shadowed `min` or `f32` would
# break the generated code that calls them
_PREDECLARED = """
bool f16 f32 i32 u32 vec2 vec3 vec4 mat2x2 mat2x3 mat2x4 mat3x2 mat3x3 mat3x4 mat4x2 mat4x3 mat4x4
array atomic ptr sampler sampler_comparison
vec2i vec3i vec4i vec2u vec3u vec4u vec2f vec3f vec4f vec2h vec3h vec4h
mat2x2f mat2x3f mat2x4f mat3x2f mat3x3f mat3x4f mat4x2f mat4x3f mat4x4f
read write read_write function private workgroup uniform storage
all any select arrayLength abs acos acosh asin asinh atan atanh atan2 ceil clamp cos cosh
countLeadingZeros countOneBits countTrailingZeros cross degrees determinant distance dot exp exp2
extractBits faceForward firstLeadingBit firstTrailingBit floor fma fract frexp insertBits
inverseSqrt ldexp length log log2 max min mix modf normalize pow quantizeToF16 radians reflect
refract reverseBits round saturate sign sin sinh smoothstep sqrt step tan tanh transpose trunc
bitcast atomicLoad atomicStore atomicAdd atomicSub atomicMax atomicMin atomicAnd atomicOr atomicXor
atomicExchange atomicCompareExchangeWeak storageBarrier workgroupBarrier textureBarrier
workgroupUniformLoad dpdx dpdy fwidth pack4x8snorm pack4x8unorm pack2x16snorm pack2x16unorm
pack2x16float unpack4x8snorm unpack4x8unorm unpack2x16snorm unpack2x16unorm unpack2x16float
"""
RESERVED = frozenset(_KEYWORDS.split()) | frozenset(_PREDECLARED.split())

_BAD = re.compile(r"[^0-9A-Za-z_]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sanitize(hint: str | None, fallback: str = "v") -> str:
    """'x.grad' -> 'x_grad'; no leading underscores ('__' is reserved in WGSL); keywords get '_'."""
    name = _BAD.sub("_", hint or "").strip("_")
    name = re.sub(r"__+", "_", name)
    if not name:
        name = fallback
    if name[0].isdigit():
        name = fallback + name
    if name in RESERVED:
        name += "_"
    return name


def identifiers(wgsl: str) -> set[str]:
    """Every identifier-like token of a WGSL text, comments excluded."""
    code = re.sub(r"//[^\n]*", "", wgsl)
    return set(_IDENT.findall(code))


class Namer:
    """Hands out unique names: the hint when free, else hint_1, hint_2 ..."""

    def __init__(self, taken=()):
        self.taken: set[str] = set(RESERVED) | set(taken)
        self._next: dict[str, int] = {}  # per hint: the next suffix to try (keeps naming linear)

    def reserve(self, *names: str) -> None:
        self.taken.update(names)

    def fresh(self, hint: str | None, fallback: str = "v") -> str:
        base = sanitize(hint, fallback)
        name, k = base, self._next.get(base, 1)
        if name in self.taken:
            name = f"{base}_{k}"
            while name in self.taken:
                k += 1
                name = f"{base}_{k}"
            self._next[base] = k + 1
        self.taken.add(name)
        return name
