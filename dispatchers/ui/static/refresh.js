// Live refresh for pages whose <main> has data-refresh="SECONDS": fetch the same
// page again and swap in its <main>. The page works without this script; only
// the refresh is lost. No inline script anywhere: the CSP allows this file only.
"use strict";
(function () {
  const main = document.getElementById("main");
  const seconds = main ? Number(main.dataset.refresh) : 0;
  if (!seconds) return;
  async function refresh() {
    if (document.hidden) return;
    try {
      const response = await fetch(window.location.href, {
        credentials: "same-origin",
        headers: { Accept: "text/html" },
      });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.getElementById("main");
      if (fresh) main.replaceChildren(...fresh.childNodes);
    } catch (error) {
      // offline or restarting: try again at the next tick
    }
  }
  window.setInterval(refresh, seconds * 1000);
})();
