//! Debian's Chromium, headless, driven over the DevTools protocol: the few commands a page
//! test needs (open a page, read the DOM, click at an element, take a screenshot), spoken as
//! JSON over one WebSocket.
//!
//! ```ignore
//! let Some(browser) = Chromium::start("the_page_loads").await else { return };
//! let page = browser.page().await;
//! page.goto("http://127.0.0.1:8025/").await;
//! let state = page.eval("document.querySelector('.state').textContent").await;
//! ```
//!
//! Include it with `#[path = "support/chromium.rs"] mod chromium;` beside `mod support;`.
//! The browser is killed, and its profile folder removed, when the `Chromium` is dropped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_tungstenite::tungstenite::Message as Frame;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::servers::require_program;

/// How long Chromium has to say where its DevTools listen.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// How long one DevTools command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A headless Chromium with a fresh profile, and the DevTools connection to it.
pub struct Chromium {
    child: Child,
    profile: PathBuf,
    socket: Mutex<WebSocketStream<MaybeTlsStream<TcpStream>>>,
    next_id: AtomicU64,
}

/// One tab, attached in its own DevTools session.
pub struct Page<'a> {
    browser: &'a Chromium,
    session: String,
}

impl Chromium {
    /// Starts Debian's `chromium` headless; `None` after printing `SKIPPED <test>` when it
    /// is not installed (under `CI=true` that panics instead).
    pub async fn start(test: &str) -> Option<Chromium> {
        let program = require_program("chromium", test)?;
        let profile = std::env::temp_dir().join(format!(
            "mail-breaker-chromium-{}-{test}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).expect("making Chromium's profile folder");
        let mut child = Command::new(program)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--remote-debugging-port=0",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting chromium");
        let stderr = child.stderr.take().expect("chromium's stderr");
        let (found, listening) = std::sync::mpsc::channel();
        // Chromium prints `DevTools listening on ws://...` on stderr; the rest is drained so
        // that it never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = found.send(url.trim().to_owned());
                }
            }
        });
        let url = match listening.recv_timeout(STARTUP_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{test}: chromium did not open its DevTools within {STARTUP_TIMEOUT:?}");
            }
        };
        let (socket, _) = tokio_tungstenite::connect_async(&url)
            .await
            .expect("connecting to Chromium's DevTools");
        Some(Chromium {
            child,
            profile,
            socket: Mutex::new(socket),
            next_id: AtomicU64::new(1),
        })
    }

    /// Sends one command (to the browser, or to a page's `session`) and waits for its answer,
    /// passing over the events in between. A protocol error is returned as `Err`.
    async fn command(
        &self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut request = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            request["sessionId"] = json!(session);
        }
        let mut socket = self.socket.lock().await;
        socket
            .send(Frame::Text(request.to_string().into()))
            .await
            .expect("writing to Chromium");
        let answer = tokio::time::timeout(COMMAND_TIMEOUT, async {
            while let Some(frame) = socket.next().await {
                let Ok(Frame::Text(text)) = frame else {
                    continue;
                };
                let Ok(message) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if message["id"] == id {
                    return message;
                }
            }
            panic!("Chromium closed its DevTools connection");
        })
        .await
        .unwrap_or_else(|_| panic!("Chromium did not answer {method} within {COMMAND_TIMEOUT:?}"));
        match answer.get("error") {
            Some(error) => Err(error.clone()),
            None => Ok(answer["result"].clone()),
        }
    }

    /// A new tab of `width` by `height` CSS pixels.
    pub async fn page(&self, width: u32, height: u32) -> Page<'_> {
        let target = self
            .command(None, "Target.createTarget", json!({ "url": "about:blank" }))
            .await
            .expect("a new tab");
        let attached = self
            .command(
                None,
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await
            .expect("attaching to the tab");
        let page = Page {
            browser: self,
            session: attached["sessionId"]
                .as_str()
                .expect("a session")
                .to_owned(),
        };
        page.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 600 }),
        )
        .await;
        page
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Page<'_> {
    async fn call(&self, method: &str, params: Value) -> Value {
        self.browser
            .command(Some(&self.session), method, params)
            .await
            .unwrap_or_else(|error| panic!("{method}: {error}"))
    }

    /// Opens `url` in the tab.
    pub async fn goto(&self, url: &str) {
        self.call("Page.navigate", json!({ "url": url })).await;
    }

    /// The value of `expression` evaluated in the page, or `None` while the page has none to
    /// give (loading, or the expression threw).
    pub async fn eval(&self, expression: &str) -> Option<Value> {
        let result = self
            .browser
            .command(
                Some(&self.session),
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await
            .ok()?;
        if result.get("exceptionDetails").is_some() {
            return None;
        }
        result["result"].get("value").cloned()
    }

    /// Waits up to `within` for `expression` to give `expected`; the last value seen if not.
    pub async fn wait_for(
        &self,
        expression: &str,
        expected: &Value,
        within: Duration,
    ) -> Result<(), Option<Value>> {
        let deadline = Instant::now() + within;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.eval(expression).await;
            if last.as_ref() == Some(expected) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last)
    }

    /// Clicks with the mouse at the middle of the first element `selector` finds, as a person
    /// would (the browser hit-tests the point).
    pub async fn click(&self, selector: &str) {
        let expression = format!(
            "(() => {{ const e = document.querySelector({selector:?}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.x + r.width / 2, r.y + r.height / 2]; }})()"
        );
        let point = self
            .eval(&expression)
            .await
            .filter(|point| point.is_array())
            .unwrap_or_else(|| panic!("no element {selector} to click"));
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": point[0], "y": point[1], "button": "left", "clickCount": 1 }),
            )
            .await;
        }
    }

    /// Whether the page is shown as in a dark system theme.
    pub async fn prefer_dark(&self, dark: bool) {
        let value = if dark { "dark" } else { "light" };
        self.call(
            "Emulation.setEmulatedMedia",
            json!({ "features": [{ "name": "prefers-color-scheme", "value": value }] }),
        )
        .await;
    }

    /// A PNG of the whole page (not only the window), written to `path`.
    pub async fn screenshot(&self, path: &std::path::Path) {
        let metrics = self.call("Page.getLayoutMetrics", json!({})).await;
        let size = &metrics["cssContentSize"];
        let clip =
            json!({ "x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1 });
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true, "clip": clip }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("the screenshot's data"))
            .expect("a base64 screenshot");
        if let Some(folder) = path.parent() {
            std::fs::create_dir_all(folder).expect("the screenshot's folder");
        }
        std::fs::write(path, png).expect("writing the screenshot");
    }
}
