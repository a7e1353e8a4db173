// The dashboard's one script. Every page works without it; it adds:
// - live refresh, for pages whose <main> has data-refresh="SECONDS": fetch the
//   same page again and swap in its <main>;
// - local time: the server writes every time in UTC, in <time datetime=...>;
//   the header's button switches them to this browser's time zone and back (the
//   choice is kept in localStorage), the other form always in the title.
// No inline script anywhere: the CSP allows this file only.
"use strict";
(function () {
  const KEY = "outbox-times";
  const pad = (n) => String(n).padStart(2, "0");

  function localText(date) {
    const offset = -date.getTimezoneOffset();
    const sign = offset < 0 ? "-" : "+";
    const abs = Math.abs(offset);
    return (
      `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
      `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())} ` +
      `${sign}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`
    );
  }

  function local() {
    try {
      return window.localStorage.getItem(KEY) === "local";
    } catch (error) {
      return false; // storage refused: UTC, as the server writes it
    }
  }

  function showTimes(root) {
    const inLocal = local();
    for (const element of root.querySelectorAll("time[datetime]")) {
      if (element.dataset.utc === undefined) element.dataset.utc = element.textContent;
      const date = new Date(element.getAttribute("datetime"));
      if (Number.isNaN(date.getTime())) continue;
      const utc = element.dataset.utc;
      const here = localText(date);
      element.textContent = inLocal ? here : utc;
      element.title = inLocal ? `${utc} (UTC)` : `${here} (local time)`;
    }
    const toggle = document.getElementById("times");
    if (toggle) {
      toggle.hidden = false;
      toggle.textContent = inLocal ? "Times: local" : "Times: UTC";
      toggle.setAttribute("aria-pressed", inLocal ? "true" : "false");
    }
  }

  const toggle = document.getElementById("times");
  if (toggle) {
    toggle.addEventListener("click", () => {
      try {
        window.localStorage.setItem(KEY, local() ? "utc" : "local");
      } catch (error) {
        return;
      }
      showTimes(document);
    });
  }
  showTimes(document);

  const main = document.getElementById("main");
  const seconds = main ? Number(main.dataset.refresh) : 0;
  if (!seconds) return;
  async function refresh() {
    if (document.hidden) return;
    // a field of the page being filled in (the overview's tenant filter) would
    // lose what was typed: wait until it is left
    const active = document.activeElement;
    if (active && main.contains(active) && active.matches("input, select, textarea")) return;
    try {
      const response = await fetch(window.location.href, {
        credentials: "same-origin",
        headers: { Accept: "text/html" },
      });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("main");
      if (fresh) {
        main.replaceChildren(...fresh.childNodes);
        showTimes(main);
      }
    } catch (error) {
      // offline or restarting: try again at the next tick
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
