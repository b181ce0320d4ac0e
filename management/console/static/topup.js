// The billing page's top-up (docs/payments.md, "Topping up on the console"). The card is typed into the payment
// provider's own element, drawn by the provider's script (Stripe.js, loaded from the provider's origin), and goes from
// the browser to the provider only. The grid is asked to check the amount and open a card setup, the provider's
// script saves the card with it, and the grid then charges the amount to the saved card; the balance grows when the
// provider's signed webhook says the money arrived.
(function () {
  "use strict";
  var form = document.getElementById("topup-form");
  if (!form || typeof window.Stripe !== "function") return;
  var status = document.getElementById("topup-status");
  var button = document.getElementById("topup-pay");
  var token = document.querySelector('meta[name="csrf-token"]');
  var stripe = window.Stripe(form.getAttribute("data-key"));
  var card = stripe.elements().create("card");
  card.mount("#card-element");

  function say(text) {
    status.textContent = text;
  }

  function ask(path, body) {
    return fetch(path, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": token ? token.content : "" },
      body: JSON.stringify(body),
    }).then(function (response) {
      return response.json().catch(function () { return { error: "the grid answered " + response.status }; });
    });
  }

  function refused(error) {
    var message = error && error.message ? error.message : String(error || "the payment did not go through");
    say("Not paid: " + message);
    button.disabled = false;
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var amount = document.getElementById("topup-amount").value.trim();
    button.disabled = true;
    say("Opening the payment…");
    ask("/console/billing/topup/setup", { amount: amount }).then(function (opened) {
      if (opened.error) return refused(opened.error);
      say("Sending the card to the payment provider…");
      return stripe.confirmCardSetup(opened.client_secret, { payment_method: { card: card } }).then(function (saved) {
        if (saved.error) return refused(saved.error);
        say("Charging the card…");
        return ask("/console/billing/topup/pay", { amount: amount, setup: saved.setupIntent.id }).then(function (paid) {
          if (paid.error) return refused(paid.error);
          var done = function () { window.location.assign("/console/billing?topup=" + encodeURIComponent(paid.topup)); };
          if (!paid.client_secret) return done();
          say("Your card asks you to confirm the payment…");
          return stripe.confirmCardPayment(paid.client_secret).then(function (confirmed) {
            if (confirmed.error) return refused(confirmed.error);
            done();
          });
        });
      });
    }).catch(refused);
  });
})();
