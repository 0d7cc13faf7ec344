// The console's only script. Without it every page still reads; with it the moves list and a
// batch's page are live (server-sent events: each event is the section, rendered by the server)
// and times show in the viewer's zone, UTC on hover.
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
  if (!window.EventSource) return;
  for (const section of document.querySelectorAll("[data-events]")) {
    const events = new EventSource(section.dataset.events);
    events.addEventListener(section.dataset.event || "moves", (e) => {
      section.innerHTML = e.data;
      localTimes(section);
      section.dataset.updated = String(Number(section.dataset.updated || 0) + 1);
    });
  }
});
