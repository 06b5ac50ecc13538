// Starts GraphiQL against this Courier. Open /graphql#token=<API token>, or arrive from the
// console in the same tab: the token is kept in this tab's sessionStorage, removed from the
// address bar, and leaves the browser only as the Authorization header (HTTP) and the
// connection_init payload (WebSocket). It is never shown in the headers editor, and what
// GraphiQL remembers (tabs, history) is kept for the tab only, like the token.
"use strict";
(function () {
  const KEY = "courier.token";
  /** The prefix GraphiQL gives every key it stores. */
  const OWN = "graphiql:";

  // Earlier versions let GraphiQL keep its tabs and history, headers and so the token
  // included, in localStorage, where they outlived the tab: gone.
  for (const key of Object.keys(localStorage)) {
    if (key.startsWith(OWN)) localStorage.removeItem(key);
  }

  /** GraphiQL's storage, in this tab's sessionStorage (the console's sign-out clears it). */
  const tabStorage = {
    getItem: (key) => sessionStorage.getItem(key),
    setItem: (key, value) => sessionStorage.setItem(key, value),
    removeItem: (key) => sessionStorage.removeItem(key),
    get length() {
      return Object.keys(sessionStorage).filter((key) => key.startsWith(OWN)).length;
    },
    clear() {
      for (const key of Object.keys(sessionStorage)) {
        if (key.startsWith(OWN)) sessionStorage.removeItem(key);
      }
    },
  };

  /** The token in the fragment, if any, taken out of the address bar and kept for the tab. */
  function takeFragmentToken() {
    const token = new URLSearchParams(window.location.hash.slice(1)).get("token");
    if (token) {
      sessionStorage.setItem(KEY, token);
      history.replaceState(null, "", window.location.pathname);
    }
    return token;
  }

  // Another #token= link opened in this tab: start again signed in with it.
  window.addEventListener("hashchange", () => {
    if (takeFragmentToken()) window.location.reload();
  });

  const token = takeFragmentToken() || sessionStorage.getItem(KEY);
  const auth = token ? { Authorization: "Bearer " + token } : {};
  const base = new URL("graphql", document.baseURI);
  const ws = new URL("graphql/ws", document.baseURI);
  ws.protocol = ws.protocol === "https:" ? "wss:" : "ws:";
  ReactDOM.createRoot(document.getElementById("graphiql")).render(
    React.createElement(GraphiQL, {
      fetcher: GraphiQL.createFetcher({
        url: base.toString(),
        subscriptionUrl: ws.toString(),
        headers: auth,
        wsConnectionParams: auth,
      }),
      storage: tabStorage,
      shouldPersistHeaders: false,
      defaultEditorToolsVisibility: true,
    })
  );
})();
