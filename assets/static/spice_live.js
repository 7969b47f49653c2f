(payload) => {
  // Live panels, browser side (pages/chat.py sends `payload`, a JSON string, while a reply streams).
  // The server sends changes, not figures: for the heatmap the two grids, for the prefetch
  // timeline and the lane chart their traces. Each panel's figure was drawn once by gr.Plot with a
  // `layout.meta` tag; updates only apply to a figure carrying the same tag.
  // The refresh rate adapts to this browser: after a panel took D ms to draw, the next update of that
  // panel waits at least GAP_FACTOR * D ms; updates that arrive meanwhile replace each other, so a slow
  // machine draws less often instead of falling behind (and typing, Stop and scrolling stay responsive).
  const GAP_FACTOR = 6, MIN_GAP_MS = 250, RETRY_MS = 300, GIVE_UP_MS = 8000;
  const S = (window.__spiceLive = window.__spiceLive || { panels: {} });
  let msg;
  try { msg = typeof payload === "string" && payload ? JSON.parse(payload) : null; } catch (e) { return []; }
  if (!msg || !msg.panels) return [];
  const Plotly = window.Plotly;  // set by Gradio's plot component once a plot has been drawn

  const apply = (name, p) => {
    const gd = document.querySelector(`#spice-${name} .js-plotly-plot`);
    if (!Plotly || !gd || !gd.layout || gd.layout.meta !== p.meta) return false;   // base figure not drawn yet
    if (name === "heatmap") {
      // z is what is drawn (the right grid shaded by how many tokens used each expert), codes the outcomes.
      const names = p.names || [], symbols = p.symbols || [];
      const text = p.codes.map((grid) => grid.map((row) => row.map((c) => names[c] || "")));
      // Trace 2 marks the token's approximated and CPU cells (pages/figures.OUTCOME_MARKS; the right grid's
      // marks come with the reply's last figure).
      const rows = gd.data[0].y, mark = { x: [], y: [], symbol: [] };
      p.codes[0].forEach((row, i) => row.forEach((c, j) => {
        if (symbols[c]) { mark.x.push(j); mark.y.push(rows[i]); mark.symbol.push(symbols[c]); }
      }));
      const ann = (gd.layout.annotations || []).map((a, i) => (i < p.titles.length ? { ...a, text: p.titles[i] } : a));
      // One redraw; restyle leaves a trace alone where its value is undefined.
      Plotly.update(gd, { z: [...p.z, undefined], text: [...text, undefined], x: [undefined, undefined, mark.x],
                          y: [undefined, undefined, mark.y], "marker.symbol": [undefined, undefined, mark.symbol] },
                    { annotations: ann }, [0, 1, 2]);
    } else {
      const layout = { ...gd.layout };
      for (const [k, v] of Object.entries(p.layout || {})) layout[k] = (v && typeof v === "object" && !Array.isArray(v))
        ? { ...(gd.layout[k] || {}), ...v } : v;
      // Gradio draws plots responsive (the SVG fills the plot's div) and autosized; its resize clears the
      // figure's height, and a redraw then measured a div that took its height from the SVG: 0, and the panel
      // vanished. The div gets the figure's height, so the SVG has one to fill.
      if (typeof layout.height === "number") gd.style.height = `${layout.height}px`;
      Plotly.react(gd, p.data, layout, gd._context);
    }
    return true;
  };

  const run = (name) => {
    const st = S.panels[name];
    st.timer = null;
    const p = st.pending;
    if (!p) return;
    const now = performance.now();
    const wait = st.lastEnd + Math.max(MIN_GAP_MS, GAP_FACTOR * st.lastCost) - now;
    if (wait > 0) { st.timer = setTimeout(() => run(name), wait); return; }
    let ok = false;
    const t0 = performance.now();
    try { ok = apply(name, p); } catch (e) { console.warn("spice live panel", name, e); ok = true; }
    if (!ok) {
      if (now - p.at < GIVE_UP_MS) st.timer = setTimeout(() => run(name), RETRY_MS);
      else st.pending = null;
      return;
    }
    st.pending = null;
    st.lastEnd = performance.now();
    st.lastCost = st.lastEnd - t0;
    // Plotly draws synchronously for these traces; the next frame shows what the page paid for it.
    requestAnimationFrame(() => {
      st.lastCost = performance.now() - t0;
      st.lastEnd = performance.now();
      S.costs = Object.fromEntries(Object.entries(S.panels).map(([k, v]) => [k, Math.round(v.lastCost)]));
    });
  };

  for (const [name, p] of Object.entries(msg.panels)) {
    const st = (S.panels[name] = S.panels[name] || { pending: null, timer: null, lastCost: 0, lastEnd: 0 });
    st.pending = { ...p, at: performance.now() };
    if (!st.timer) run(name);
  }
  return [];
}
