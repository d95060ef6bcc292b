// The KafScale console's only script: tables narrow as you type in their filter box (the
// server filters on Enter), and elements marked data-refresh="N" are reloaded every N seconds.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  for (const input of document.querySelectorAll("input[data-filter]")) {
    const table = document.querySelector(input.dataset.filter);
    if (!table) continue;
    input.addEventListener("input", () => {
      const needle = input.value.trim().toLowerCase();
      for (const row of table.querySelectorAll("tbody tr[data-name]")) {
        row.classList.toggle("hidden", !row.dataset.name.toLowerCase().includes(needle));
      }
    });
  }
  for (const element of document.querySelectorAll("[data-refresh]")) {
    const seconds = Math.max(2, Number(element.dataset.refresh) || 15);
    if (!element.id) element.id = "refresh-" + Math.random().toString(36).slice(2);
    setInterval(async () => {
      if (document.hidden) return;
      const response = await fetch(location.href, { headers: { Accept: "text/html" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("[data-refresh]");
      const current = document.getElementById(element.id);
      if (fresh && current) current.innerHTML = fresh.innerHTML;
    }, seconds * 1000);
  }
});
