// The simulation of the browser demo, without the page: autodiff gravity (examples/gravity.py) from
// the kernels build.py exported. Each substep records compute_U on a tape; its adjoint leaves dU/dx
// in x.grad, and advance moves the particles with the forces -dU/dx. No DOM here, so node + the
// `webgpu` package runs the same code (tests/test_browser_demo.py).
import { load } from "./export/wgpu_ad.js";

// Forces grow with n (a sum of n pair terms) and orbits shrink: the step shrinks like 1/n, as in
// examples/gravity.py.
export const DT_PER_PARTICLE = 2.5e-3;

/** Load the exported kernels (`exportUrl`: the folder build.py wrote) and make a simulation. */
export async function createGravity(device, exportUrl) {
  const prog = await load(device, exportUrl);
  return new Gravity(prog);
}

class Gravity {
  constructor(prog) {
    this.prog = prog;
    this.capacity = prog.fields.x.shape[0];
    this.n = 0;
  }

  get dt() { return DT_PER_PARTICLE / Math.max(this.n, 1); }

  /** Positions x and velocities v (flat [x0, y0, x1, y1, ...]) of n particles; the rest are unused. */
  setState(x, v) {
    if (x.length !== v.length || x.length % 2 || x.length / 2 > this.capacity) {
      throw new Error(`setState: x and v need 2n numbers each, n <= ${this.capacity} (got ${x.length} and ${v.length})`);
    }
    this.n = x.length / 2;
    const full = (a) => { const f = new Float32Array(2 * this.capacity); f.set(a); return f; };
    this.prog.write("x", full(x));
    this.prog.write("v", full(v));
  }

  /** A disc of n particles around (0.5, 0.5), turning at `spin` times the speed of a circular orbit. */
  reset(n, { seed = 1, spin = 0.7, radius = 0.3 } = {}) {
    const random = mulberry32(seed);
    const x = new Float32Array(2 * n), v = new Float32Array(2 * n);
    for (let i = 0; i < n; i++) {
      const r = radius * Math.sqrt(random()), a = 2 * Math.PI * random();
      const dx = r * Math.cos(a), dy = r * Math.sin(a);
      // the mass inside radius r pulls like a point (each pair counts twice in U: a factor 2)
      const speed = spin * Math.sqrt(2 * n * (r / radius) ** 2 / Math.max(r, 0.02));
      x.set([0.5 + dx, 0.5 + dy], 2 * i);
      v.set([-speed * dy / Math.max(r, 1e-6), speed * dx / Math.max(r, 1e-6)], 2 * i);
    }
    this.setState(x, v);
  }

  /** One step: the tape leaves dU/dx in x.grad, then advance (symplectic Euler). */
  async substep() {
    const n = this.n;
    await this.prog.tape("U", async (t) => { await t.run("compute_U", { n }); });
    await this.prog.run("advance", { n, dt: this.dt });
  }

  async substeps(k) { for (let s = 0; s < k; s++) await this.substep(); }

  /** Add a particle (a click); false when the fields are full. */
  async add(px, py, vx = 0, vy = 0) {
    if (this.n >= this.capacity) return false;
    await this.prog.run("place", { i: this.n, px, py, vx, vy });
    this.n += 1;
    return true;
  }

  /** The first n particles' positions, velocities and dU/dx (of the latest tape), and U. */
  async state() {
    const m = 2 * this.n;
    const [x, v, grad, U] = await Promise.all(["x", "v", "x.grad", "U"].map((f) => this.prog.read(f)));
    return { n: this.n, x: x.slice(0, m), v: v.slice(0, m), grad: grad.slice(0, m), U: U[0] };
  }

  /** Kinetic and potential energy now (U evaluated at the current positions, outside any tape). */
  async energy() {
    this.prog.fill("U", 0);
    await this.prog.run("compute_U", { n: this.n });
    const [v, U] = await Promise.all([this.prog.read("v"), this.prog.read("U")]);
    let k = 0;
    for (let i = 0; i < 2 * this.n; i++) k += 0.5 * v[i] * v[i];
    return { kinetic: k, potential: U[0] };
  }
}

// a small seeded generator, so a reset (and a test) starts from the same particles every time
function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
