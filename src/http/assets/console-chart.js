// The throughput chart: deliveries and failed attempts per second over the last minutes,
// drawn on a canvas once a second from per-second buckets (no library, no allocation per event).
"use strict";

const COLORS = { delivered: "#1a7f37", failed: "#b42318", grid: "#d0d7de", text: "#424a53" };

/** Per-second counts of two series in a ring of `seconds` buckets, and their drawing. */
export class ThroughputChart {
  constructor(canvas, summary, seconds = 300) {
    this.canvas = canvas;
    this.summary = summary;
    this.seconds = seconds;
    this.stamp = new Float64Array(seconds).fill(-1);
    this.delivered = new Uint32Array(seconds);
    this.failed = new Uint32Array(seconds);
    new ResizeObserver(() => this.resize()).observe(canvas);
    setInterval(() => this.draw(), 1000);
  }

  /** Counts one event of `kind` ("delivered" or "failed") now. */
  record(kind) {
    const second = Math.floor(Date.now() / 1000);
    const slot = second % this.seconds;
    if (this.stamp[slot] !== second) {
      this.stamp[slot] = second;
      this.delivered[slot] = 0;
      this.failed[slot] = 0;
    }
    this[kind][slot] += 1;
  }

  /** Forgets every count (a new key's chart starts empty). */
  reset() {
    this.stamp.fill(-1);
    this.draw();
  }

  resize() {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(1, Math.round(this.canvas.clientWidth * ratio));
    const height = Math.max(1, Math.round(this.canvas.clientHeight * ratio));
    if (this.canvas.width !== width || this.canvas.height !== height) {
      this.canvas.width = width;
      this.canvas.height = height;
    }
    this.draw();
  }

  /** The two series, oldest first, for the seconds up to now. */
  series() {
    const now = Math.floor(Date.now() / 1000);
    const delivered = new Array(this.seconds);
    const failed = new Array(this.seconds);
    for (let i = 0; i < this.seconds; i++) {
      const second = now - this.seconds + 1 + i;
      const slot = ((second % this.seconds) + this.seconds) % this.seconds;
      const fresh = this.stamp[slot] === second;
      delivered[i] = fresh ? this.delivered[slot] : 0;
      failed[i] = fresh ? this.failed[slot] : 0;
    }
    return { delivered, failed };
  }

  draw() {
    const { canvas } = this;
    const ctx = canvas.getContext("2d");
    if (!ctx || canvas.width < 2) return;
    const ratio = window.devicePixelRatio || 1;
    const { delivered, failed } = this.series();
    const peak = Math.max(1, ...delivered, ...failed);
    const top = niceCeiling(peak);
    const pad = { left: 40 * ratio, right: 8 * ratio, top: 10 * ratio, bottom: 20 * ratio };
    const w = canvas.width - pad.left - pad.right;
    const h = canvas.height - pad.top - pad.bottom;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.font = `${11 * ratio}px system-ui, sans-serif`;
    ctx.fillStyle = COLORS.text;
    ctx.strokeStyle = COLORS.grid;
    ctx.lineWidth = ratio;
    ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    for (const fraction of [0, 0.5, 1]) {
      const y = pad.top + h - fraction * h;
      ctx.beginPath();
      ctx.moveTo(pad.left, y);
      ctx.lineTo(pad.left + w, y);
      ctx.stroke();
      ctx.fillText(formatRate(top * fraction), pad.left - 6 * ratio, y);
    }
    ctx.textAlign = "center";
    ctx.textBaseline = "top";
    const minutes = Math.round(this.seconds / 60);
    for (let m = 0; m <= minutes; m++) {
      const x = pad.left + w - (m * 60 * w) / (this.seconds - 1);
      ctx.textAlign = m === 0 ? "right" : m === minutes ? "left" : "center";
      ctx.fillText(m === 0 ? "now" : `-${m}m`, Math.max(pad.left, x), pad.top + h + 5 * ratio);
    }
    const line = (values, color, dash) => {
      ctx.strokeStyle = color;
      ctx.lineWidth = 2 * ratio;
      ctx.setLineDash(dash.map((d) => d * ratio));
      ctx.beginPath();
      values.forEach((value, i) => {
        const x = pad.left + (i * w) / (values.length - 1);
        const y = pad.top + h - (value / top) * h;
        if (i === 0) ctx.moveTo(x, y);
        else ctx.lineTo(x, y);
      });
      ctx.stroke();
      ctx.setLineDash([]);
    };
    line(delivered, COLORS.delivered, []);
    line(failed, COLORS.failed, [5, 3]);
    const lastMinute = (values) => values.slice(-60).reduce((a, b) => a + b, 0);
    const text = `Seen live in the last minute: ${lastMinute(delivered)} delivered, ${lastMinute(failed)} failed attempts.`;
    if (this.summary.textContent !== text) this.summary.textContent = text;
  }
}

/** 1, 2, 5, 10, 20, 50, ... at or above `value`. */
function niceCeiling(value) {
  const magnitude = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (step * magnitude >= value) return step * magnitude;
  }
  return 10 * magnitude;
}

function formatRate(value) {
  return Number.isInteger(value) ? String(value) : value.toFixed(1);
}
