// Starts GraphiQL against this Courier. Open /graphql#token=<API token>, or arrive from the
// console in the same tab: the token is kept in this tab's sessionStorage, removed from the
// address bar, and leaves the browser only as the Authorization header (HTTP) and the
// connection_init payload (WebSocket).
"use strict";
(function () {
  const KEY = "courier.token";
  const fromFragment = new URLSearchParams(window.location.hash.slice(1)).get("token");
  if (fromFragment) {
    sessionStorage.setItem(KEY, fromFragment);
    history.replaceState(null, "", window.location.pathname);
  }
  const token = fromFragment || sessionStorage.getItem(KEY);
  const auth = token ? { Authorization: "Bearer " + token } : {};
  const base = new URL("/graphql", window.location.origin);
  const ws = new URL("/graphql/ws", window.location.origin);
  ws.protocol = ws.protocol === "https:" ? "wss:" : "ws:";
  ReactDOM.createRoot(document.getElementById("graphiql")).render(
    React.createElement(GraphiQL, {
      fetcher: GraphiQL.createFetcher({
        url: base.toString(),
        subscriptionUrl: ws.toString(),
        headers: auth,
        wsConnectionParams: auth,
      }),
      defaultHeaders: JSON.stringify(auth, null, 2),
      defaultEditorToolsVisibility: true,
    })
  );
})();
