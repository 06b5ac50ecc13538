//! A real headless Chromium (Debian's `chromium`) driven over the DevTools protocol, with a
//! record of every request and WebSocket each page opens.
//!
//! The protocol is spoken directly (JSON over the WebSocket the tests already use): a few
//! commands are all the tests need, and generated CDP bindings would not parse Chromium's
//! events under the workspace's `serde_json/arbitrary_precision`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::stream::SplitSink;
use futures_util::{SinkExt as _, StreamExt as _};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// What to install when no browser is found.
const INSTALL: &str = "the console tests need Chromium: install it with \
     `apt-get install chromium` (Debian/Ubuntu), or name one in COURIER_TEST_CHROMIUM";

/// How long one DevTools command, a launch or a page load may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Records what the page's Content-Security-Policy blocked, in `window.__cspViolations`.
const CSP_RECORDER: &str = "window.__cspViolations = []; document.addEventListener(\
     'securitypolicyviolation', (e) => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));";

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// One DevTools connection: commands matched to their answers, events kept in order.
struct Connection {
    sink: tokio::sync::Mutex<Sink>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    events: Mutex<Vec<Value>>,
}

impl Connection {
    /// Sends `method` (to `session`, or the browser) and returns its result.
    async fn call(&self, session: Option<&str>, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, answer);
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.sink
            .lock()
            .await
            .send(Message::text(message.to_string()))
            .await
            .unwrap_or_else(|err| panic!("sending {method} to the browser failed: {err}"));
        let reply = tokio::time::timeout(COMMAND_TIMEOUT, answered)
            .await
            .unwrap_or_else(|_| panic!("the browser did not answer {method}"))
            .unwrap_or_else(|_| panic!("the browser went away during {method}"));
        if let Some(error) = reply.get("error") {
            panic!("{method} failed: {error}");
        }
        reply["result"].clone()
    }

    /// ChangeBus of `session` named `method`, from the `from`th event on.
    fn events(&self, session: &str, method: &str, from: usize) -> Vec<Value> {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .skip(from)
            .filter(|e| e["sessionId"] == session && e["method"] == method)
            .cloned()
            .collect()
    }

    fn event_count(&self) -> usize {
        self.events.lock().unwrap().len()
    }
}

/// A browser for one test, with its own fresh profile.
pub struct TestBrowser {
    child: Child,
    connection: Arc<Connection>,
    reader: JoinHandle<()>,
    profile: PathBuf,
}

/// A page (a tab) of a [`TestBrowser`].
pub struct TestPage {
    connection: Arc<Connection>,
    session: String,
}

impl TestBrowser {
    /// Launches headless Chromium; fails naming what to install when there is none.
    pub async fn launch() -> TestBrowser {
        let executable = chromium().unwrap_or_else(|| panic!("{INSTALL}"));
        let profile =
            std::env::temp_dir().join(format!("courier-chromium-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&profile).expect("create a browser profile directory");
        let mut child = Command::new(&executable)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--mute-audio",
                "--hide-scrollbars",
                "--window-size=1280,800",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "starting {} failed ({err}); {INSTALL}",
                    executable.display()
                )
            });
        let stderr = child.stderr.take().expect("the browser's stderr");
        let mut lines = BufReader::new(stderr).lines();
        let endpoint = tokio::time::timeout(COMMAND_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("ws://") {
                    return Some(line[at..].trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| {
            panic!(
                "{} printed no DevTools address; {INSTALL}",
                executable.display()
            )
        });
        // Keep draining its stderr so the browser never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .expect("connect to the browser's DevTools");
        let (sink, mut stream) = socket.split();
        let connection = Arc::new(Connection {
            sink: tokio::sync::Mutex::new(sink),
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            events: Mutex::new(Vec::new()),
        });
        let shared = connection.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                match value["id"].as_u64() {
                    Some(id) => {
                        if let Some(answer) = shared.pending.lock().unwrap().remove(&id) {
                            let _ = answer.send(value);
                        }
                    }
                    None => shared.events.lock().unwrap().push(value),
                }
            }
        });
        TestBrowser {
            child,
            connection,
            reader,
            profile,
        }
    }

    /// Opens `url` in a new 1280x800 page, recording its requests from before the first one.
    pub async fn open(&self, url: &str) -> TestPage {
        self.open_with(url, "").await
    }

    /// As [`open`](Self::open), running `script` in the page before any of its own.
    pub async fn open_with(&self, url: &str, script: &str) -> TestPage {
        let connection = &self.connection;
        let target = connection
            .call(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = connection
            .call(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        let session = attached["sessionId"]
            .as_str()
            .expect("a DevTools session")
            .to_owned();
        let page = TestPage {
            connection: connection.clone(),
            session,
        };
        page.call("Page.enable", json!({})).await;
        page.call("Network.enable", json!({})).await;
        page.call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": format!("{CSP_RECORDER}\n{script}") }),
        )
        .await;
        page.resize(1280, 800).await;
        page.navigate(url).await;
        page
    }

    /// Closes the browser and removes its profile.
    pub async fn close(mut self) {
        let close = self.connection.call(None, "Browser.close", json!({}));
        let _ = tokio::time::timeout(Duration::from_secs(5), close).await;
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        self.reader.abort();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl TestPage {
    async fn call(&self, method: &str, params: Value) -> Value {
        self.connection
            .call(Some(&self.session), method, params)
            .await
    }

    /// Loads `url` and waits for its `load` event.
    pub async fn navigate(&self, url: &str) {
        let from = self.connection.event_count();
        self.call("Page.navigate", json!({ "url": url })).await;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        while self
            .connection
            .events(&self.session, "Page.loadEventFired", from)
            .is_empty()
        {
            assert!(Instant::now() < deadline, "{url} did not finish loading");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Makes the viewport `width` x `height` CSS pixels.
    pub async fn resize(&self, width: u32, height: u32) {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        )
        .await;
    }

    /// Every URL the page requested so far: documents, scripts, fetches and WebSockets.
    pub fn requests(&self) -> Vec<String> {
        let session = self.session.as_str();
        let mut urls: Vec<String> = self
            .connection
            .events(session, "Network.requestWillBeSent", 0)
            .iter()
            .filter_map(|e| e["params"]["request"]["url"].as_str().map(str::to_owned))
            .collect();
        urls.extend(
            self.connection
                .events(session, "Network.webSocketCreated", 0)
                .iter()
                .filter_map(|e| e["params"]["url"].as_str().map(str::to_owned)),
        );
        urls
    }

    /// Everything the page sent and received besides URLs: request bodies, and WebSocket
    /// frames both ways.
    pub fn traffic(&self) -> Vec<String> {
        let session = self.session.as_str();
        let mut traffic: Vec<String> = self
            .connection
            .events(session, "Network.requestWillBeSent", 0)
            .iter()
            .filter_map(|e| {
                e["params"]["request"]["postData"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        for kind in [
            "Network.webSocketFrameSent",
            "Network.webSocketFrameReceived",
        ] {
            traffic.extend(
                self.connection
                    .events(session, kind, 0)
                    .iter()
                    .filter_map(|e| {
                        e["params"]["response"]["payloadData"]
                            .as_str()
                            .map(str::to_owned)
                    }),
            );
        }
        traffic
    }

    /// Evaluates `expression` (awaiting a promise) and returns its value.
    pub async fn eval<T: DeserializeOwned>(&self, expression: &str) -> T {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "awaitPromise": true, "returnByValue": true }),
            )
            .await;
        if let Some(exception) = result.get("exceptionDetails") {
            panic!(
                "`{expression}` threw: {}",
                exception["exception"]["description"]
            );
        }
        let value = result["result"]
            .get("value")
            .cloned()
            .unwrap_or(Value::Null);
        serde_json::from_value(value)
            .unwrap_or_else(|err| panic!("`{expression}` gave an unexpected value: {err}"))
    }

    /// Waits until `expression` is true, failing with `what` after `timeout`.
    pub async fn wait_for(&self, expression: &str, what: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if self.eval::<bool>(&format!("!!({expression})")).await {
                return;
            }
            if Instant::now() > deadline {
                let status: String = self
                    .eval("document.getElementById('connection')?.textContent ?? ''")
                    .await;
                panic!(
                    "timed out after {timeout:?} waiting for {what} (console status: {status:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the element `selector` matches with the mouse, at its centre, as a user would.
    pub async fn click(&self, selector: &str) {
        let selector_js = serde_json::to_string(selector).unwrap();
        let point: Option<(f64, f64)> = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({selector_js}); if (!e) return null; \
                 e.scrollIntoView({{ block: 'center' }}); const r = e.getBoundingClientRect(); \
                 return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
            ))
            .await;
        let (x, y) = point.unwrap_or_else(|| panic!("no element matches {selector}"));
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )
            .await;
        }
    }

    /// Types `text` into the focused element, as keyboard input.
    pub async fn type_text(&self, text: &str) {
        self.call("Input.insertText", json!({ "text": text })).await;
    }

    /// Presses and releases Enter.
    pub async fn press_enter(&self) {
        for kind in ["keyDown", "keyUp"] {
            let mut event = json!({
                "type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13
            });
            if kind == "keyDown" {
                event["text"] = json!("\r");
            }
            self.call("Input.dispatchKeyEvent", event).await;
        }
    }

    /// Saves a PNG screenshot of the viewport to `path`.
    pub async fn screenshot(&self, path: &Path) {
        let shot = self
            .call("Page.captureScreenshot", json!({ "format": "png" }))
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("screenshot data"))
            .expect("a base64 PNG");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

/// The Chromium to drive: `COURIER_TEST_CHROMIUM`, else the first of the usual names on PATH.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("COURIER_TEST_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}
