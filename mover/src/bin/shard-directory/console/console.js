// The console's only script. Without it every page still reads; with it the moves list is
// live (server-sent events from /events: each event is the list, rendered by the server) and
// times show in the viewer's zone, UTC on hover.
"use strict";

function localTimes(root) {
  for (const t of root.querySelectorAll("time[datetime]")) {
    const d = new Date(t.getAttribute("datetime"));
    if (!isNaN(d)) {
      t.textContent = d.toLocaleString();
      t.title = t.getAttribute("datetime");
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  const moves = document.querySelector("#moves[data-events]");
  if (!moves || !window.EventSource) return;
  const events = new EventSource(moves.dataset.events);
  events.addEventListener("moves", (e) => {
    moves.innerHTML = e.data;
    localTimes(moves);
    moves.dataset.updated = String(Number(moves.dataset.updated || 0) + 1);
  });
});
