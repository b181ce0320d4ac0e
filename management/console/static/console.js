// The console's own script: htmx sends the CSRF token on every request it makes, and "copy" buttons copy.
(function () {
  "use strict";
  var token = document.querySelector('meta[name="csrf-token"]');
  document.addEventListener("htmx:configRequest", function (event) {
    if (token) event.detail.headers["X-CSRF-Token"] = token.content;
  });
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source || !navigator.clipboard) return;
    navigator.clipboard.writeText(source.textContent.trim()).then(function () {
      button.textContent = "Copied";
      setTimeout(function () { button.textContent = "Copy"; }, 1500);
    });
  });
  // The launch form: the image "none" runs only as a sandboxed process, so typing it ticks that box (the server
  // takes it so even without this script).
  document.addEventListener("input", function (event) {
    if (event.target.id !== "image") return;
    var box = document.getElementById("allow_process_runtime");
    if (box && event.target.value.trim() === "none") box.checked = true;
  });
})();
