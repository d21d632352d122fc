// The page: draws the particles of gravity.js in a canvas, adds one per click (a drag throws it).
// URL options: ?n=256 particles at start, ?substeps=10 per frame, ?seed=1, ?spin=0.7, ?paused=1,
// ?arrows=1. window.demo is the page's handle for tests (tests/test_browser_demo.py).
import { createGravity } from "./gravity.js";

const options = new URLSearchParams(location.search);
const number = (name, fallback) => (options.has(name) ? Number(options.get(name)) : fallback);
const N0 = number("n", 256), SUBSTEPS = number("substeps", 10), SEED = number("seed", 1), SPIN = number("spin", 0.7);

const canvas = document.getElementById("view");
const ctx2d = canvas.getContext("2d");
// sharp on high-density screens: as many canvas pixels as device pixels, drawn in CSS pixels
const dpr = window.devicePixelRatio || 1;
canvas.width = canvas.height = Math.round(640 * dpr);
ctx2d.scale(dpr, dpr);
const SIZE = 640;  // the drawing's size in CSS pixels
const stats = document.getElementById("stats");
const view = { paused: options.get("paused") === "1", arrows: options.get("arrows") === "1", drag: null };

async function start() {
  if (!navigator.gpu) {
    throw new Error("This browser has no WebGPU (navigator.gpu is undefined). Chrome and Edge 113+, " +
                    "Safari 26 and Firefox 141+ on Windows have it; on Linux, Chrome needs " +
                    "--enable-unsafe-webgpu or chrome://flags/#enable-unsafe-webgpu.");
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("WebGPU is there, but requestAdapter() found no GPU adapter.");
  const device = await adapter.requestDevice();  // WebGPU's default limits: what ti.export checked
  device.onuncapturederror = (event) => console.error("WebGPU error:", event.error.message);
  device.lost.then((info) => { if (info.reason !== "destroyed") showError(`the GPU device was lost: ${info.message}`); });
  const info = adapter.info ?? {};
  const gpu = [info.vendor, info.architecture].filter((w) => w).join(" ") || "a GPU";
  const sim = await createGravity(device, new URL("./export/", import.meta.url));
  sim.reset(N0, { seed: SEED, spin: SPIN });
  expose(sim);
  let e0 = null, frames = 0, since = performance.now(), framesThen = 0, rate = 0, drift = 0;

  async function frame() {
    if (!view.paused) {
      await serial(() => sim.substeps(SUBSTEPS));
      frames += 1;
    }
    const s = await serial(() => sim.state());
    draw(s);
    if (frames % 30 === 1 || e0 === null || performance.now() - since > 3000) {  // one more launch and read-back
      const e = await serial(() => sim.energy());
      const total = e.kinetic + e.potential;
      if (e0 === null) e0 = total;
      drift = (total - e0) / Math.abs(e0);
      const now = performance.now();
      rate = (1000 * (frames - framesThen)) / (now - since);
      since = now;
      framesThen = frames;
    }
    stats.textContent = `N = ${s.n}  ·  ${SUBSTEPS} tapes / frame  ·  ${rate.toFixed(rate < 10 ? 1 : 0)} frames/s ` +
                        `on ${gpu}  ·  energy drift ${drift >= 0 ? "+" : ""}${drift.toExponential(1)}`;
    requestAnimationFrame(() => frame().catch(showError));
  }

  document.getElementById("pause").onclick = () => togglePause();
  document.getElementById("reset").onclick = () => serial(() => { sim.reset(N0, { seed: SEED, spin: SPIN }); e0 = null; });
  document.getElementById("arrows").onclick = () => { view.arrows = !view.arrows; };
  window.addEventListener("keydown", (e) => {
    if (e.key === " ") { togglePause(); e.preventDefault(); }
    if (e.key === "r") document.getElementById("reset").click();
    if (e.key === "a") view.arrows = !view.arrows;
  });
  canvas.addEventListener("pointerdown", (e) => { view.drag = { from: toSim(e), to: toSim(e) }; });
  canvas.addEventListener("pointermove", (e) => { if (view.drag) view.drag.to = toSim(e); });
  canvas.addEventListener("pointerup", async (e) => {
    const drag = view.drag;
    view.drag = null;
    if (!drag) return;
    const to = toSim(e);
    // a drag throws the particle: its speed grows with the drag's length, on the scale of the orbits
    const scale = 2 * Math.sqrt(sim.n);
    const added = await serial(() => sim.add(drag.from[0], drag.from[1], (to[0] - drag.from[0]) * scale, (to[1] - drag.from[1]) * scale));
    if (!added) stats.textContent = `full: the fields hold ${sim.capacity} particles (build.py --capacity)`;
    e0 = null;  // a new particle brings its own energy
  });
  await frame();
}

function togglePause() {
  view.paused = !view.paused;
  document.getElementById("pause").textContent = view.paused ? "run" : "pause";
}

// canvas pixels <-> simulation units: [0, 1]^2, y up (as wgpu_ad's viewer)
const px = (x, y) => [x * SIZE, (1 - y) * SIZE];
function toSim(e) {
  const r = canvas.getBoundingClientRect();
  return [(e.clientX - r.left) / r.width, 1 - (e.clientY - r.top) / r.height];
}

function draw(s) {
  ctx2d.fillStyle = "#0b1d2a";
  ctx2d.fillRect(0, 0, SIZE, SIZE);
  // blue at rest, orange from the speed of an orbit at the disc's edge up
  const vRef = 3 * Math.sqrt(Math.max(s.n, 1)), fRef = Math.max(s.n, 1);
  for (let i = 0; i < s.n; i++) {
    const [x, y] = px(s.x[2 * i], s.x[2 * i + 1]);
    if (view.arrows) {  // the force -dU/dx, its length saturating (as examples/gravity.py --arrows)
      const fx = -s.grad[2 * i], fy = -s.grad[2 * i + 1];
      const f = Math.hypot(fx, fy) + 1e-12, len = 0.03 * f / (f + fRef) * SIZE;
      ctx2d.strokeStyle = "#ff8a65";
      ctx2d.beginPath();
      ctx2d.moveTo(x, y);
      ctx2d.lineTo(x + fx / f * len, y - fy / f * len);
      ctx2d.stroke();
    }
    const speed = Math.min(Math.hypot(s.v[2 * i], s.v[2 * i + 1]) / vRef, 1);
    ctx2d.fillStyle = `rgb(${80 + 175 * speed}, ${170 + 10 * speed}, ${255 - 200 * speed})`;
    ctx2d.beginPath();
    ctx2d.arc(x, y, 2.5, 0, 2 * Math.PI);
    ctx2d.fill();
  }
  if (view.drag) {
    const [x0, y0] = px(...view.drag.from), [x1, y1] = px(...view.drag.to);
    ctx2d.strokeStyle = "#cfe3ee";
    ctx2d.beginPath();
    ctx2d.moveTo(x0, y0);
    ctx2d.lineTo(x1, y1);
    ctx2d.stroke();
  }
}

// The frame loop, clicks and tests take turns with the simulation: an await inside one substep's
// tape must not let another caller launch kernels in between.
let turn = Promise.resolve();
function serial(fn) {
  const result = turn.then(fn);
  turn = result.catch(() => {});
  return result;
}

// What the tests use: the simulation, `serial` to use it, a promise that settles once it is loaded.
let resolveReady, rejectReady;
const ready = new Promise((resolve, reject) => { resolveReady = resolve; rejectReady = reject; });
window.demo = { ready, view, serial, sim: null };
function expose(sim) {
  window.demo.sim = sim;
  resolveReady(sim.capacity);
}

function showError(error) {
  document.getElementById("error").textContent = String(error && error.message ? error.message : error);
  stats.textContent = "stopped";
  console.error(error);
  rejectReady(error);
}

start().catch(showError);
