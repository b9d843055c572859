//! A real headless Chromium, driven over WebDriver (Debian's `chromedriver`) with fantoccini,
//! for the web client's tests. Install both with `.ci/install-browser`.
//!
//! When they are missing, the build script (`integration-tests/build.rs`) sets
//! `cfg(browser_missing)` and the tests are marked ignored with the reason, which `cargo test`
//! prints; under `CI=true` it does not, and [`available`] fails the tests instead. Each [`Browser`] has its own chromedriver on a free port and a fresh
//! profile; dropping it kills chromedriver's whole process group (Chromium included), pass or
//! fail. Browser tests run one at a time: the machine may have few cores.
//! All waits poll the page against a deadline; none sleeps a fixed time.

use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

/// How long any single wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// WebDriver key codes.
pub mod keys {
    pub const ENTER: &str = "\u{e007}";
    pub const ESCAPE: &str = "\u{e00c}";
    pub const TAB: &str = "\u{e004}";
}

/// The browser binaries to use.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub chromium: PathBuf,
    pub chromedriver: PathBuf,
}

/// The window the page gets.
#[derive(Debug, Clone, Copy)]
pub enum Viewport {
    /// A 1280×900 desktop window.
    Desktop,
    /// A phone: 375×812 CSS pixels at device pixel ratio 2 (Chrome's mobile emulation).
    Phone,
    /// The desktop window with the system in dark mode (`prefers-color-scheme: dark`).
    DesktopDark,
    /// The phone with the system in dark mode.
    PhoneDark,
}

/// axe-core (tests only, vendored by `scripts/vendor-web.sh`), injected into pages to check
/// accessibility.
const AXE: &str = include_str!("../vendor/axe.min.js");

/// The browser binaries, or `None` after printing why the test is skipped. Panics instead
/// when `CI=true`: CI must run these tests.
pub fn available() -> Option<Binaries> {
    let chromium = env_path("TESSERA_CHROMIUM", "/usr/bin/chromium");
    let chromedriver = env_path("TESSERA_CHROMEDRIVER", "/usr/bin/chromedriver");
    let missing: Vec<String> = [&chromium, &chromedriver]
        .iter()
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some(Binaries {
            chromium,
            chromedriver,
        });
    }
    let why = format!(
        "{} not found; run .ci/install-browser to install Chromium and chromedriver",
        missing.join(" and ")
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("browser tests cannot run under CI=true: {why}");
    }
    eprintln!("SKIPPED browser test: {why}");
    None
}

fn env_path(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// Where screenshots go (gitignored): `integration-tests/artifacts/`.
pub fn artifacts_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("artifacts");
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// A chromedriver process group and the profile dir, removed on drop.
struct Driver {
    child: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // chromedriver leads its own process group, so this also ends the Chromium it started.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One browser session on the server at `base`.
pub struct Browser {
    pub client: Client,
    pub base: String,
    name: String,
    // Field order matters: the session is closed explicitly, then chromedriver dies, then the
    // next test may start.
    _driver: Driver,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Browser {
    /// Starts chromedriver and a fresh headless Chromium. `name` prefixes failure screenshots.
    pub async fn launch(bins: &Binaries, base: &str, viewport: Viewport, name: &str) -> Browser {
        let turn = ONE_AT_A_TIME.lock().await;
        let profile = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let port = free_port();
        let child = Command::new(&bins.chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bins.chromedriver.display()));
        let driver = Driver {
            child,
            _profile: profile,
        };
        let url = format!("http://127.0.0.1:{port}");
        wait_for_driver(&url).await;

        let mut args = vec![
            "--headless".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--no-first-run".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            format!("--user-data-dir={}", driver._profile.path().display()),
        ];
        let mut chrome_options = json!({
            "binary": bins.chromium.display().to_string(),
        });
        match viewport {
            Viewport::Desktop | Viewport::DesktopDark => {
                args.push("--window-size=1280,900".to_owned());
            }
            Viewport::Phone | Viewport::PhoneDark => {
                chrome_options["mobileEmulation"] =
                    json!({"deviceMetrics": {"width": 375, "height": 812, "pixelRatio": 2.0}});
            }
        }
        if matches!(viewport, Viewport::DesktopDark | Viewport::PhoneDark) {
            // Chromium reports `prefers-color-scheme: dark`, as a system in dark mode does.
            args.push("--force-dark-mode".to_owned());
        }
        chrome_options["args"] = json!(args);
        let mut caps = serde_json::Map::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert("goog:chromeOptions".into(), chrome_options);
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| panic!("cannot start a Chromium session: {e}"));
        Browser {
            client,
            base: base.trim_end_matches('/').to_owned(),
            name: name.to_owned(),
            _driver: driver,
            _turn: turn,
        }
    }

    /// Ends the WebDriver session (chromedriver quits Chromium); the drop then kills the rest.
    pub async fn close(self) {
        let Browser { client, .. } = self;
        let _ = client.close().await;
    }

    /// Navigates to `path` on the server.
    pub async fn open(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        if let Err(e) = self.client.goto(&url).await {
            panic!("cannot open {url}: {e}");
        }
    }

    /// Reloads the page.
    pub async fn reload(&self) {
        if let Err(e) = self.client.refresh().await {
            panic!("reload failed: {e}");
        }
    }

    /// Runs `script` (a function body; use `return`) with `args`.
    pub async fn eval(&self, script: &str, args: Vec<Value>) -> Value {
        match self.client.execute(script, args).await {
            Ok(v) => v,
            Err(e) => panic!("script failed: {e}\n{script}"),
        }
    }

    /// Runs an async script: its last argument is the callback to call with the result.
    pub async fn eval_async(&self, script: &str, args: Vec<Value>) -> Value {
        match self.client.execute_async(script, args).await {
            Ok(v) => v,
            Err(e) => panic!("async script failed: {e}\n{script}"),
        }
    }

    /// Polls `script` until it returns something truthy; returns that value. On timeout saves
    /// a screenshot and fails with `what` and the visible conversation.
    pub async fn wait_until(&self, what: &str, script: &str) -> Value {
        let started = Instant::now();
        loop {
            if let Ok(v) = self.client.execute(script, vec![]).await
                && truthy(&v)
            {
                return v;
            }
            if started.elapsed() > DEADLINE {
                self.fail(what).await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for a visible element matching `css`.
    pub async fn wait_for(&self, what: &str, css: &str) -> Element {
        let started = Instant::now();
        loop {
            if let Ok(found) = self.client.find(Locator::Css(css)).await
                && found.is_displayed().await.unwrap_or(false)
            {
                return found;
            }
            if started.elapsed() > DEADLINE {
                self.fail(what).await;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits for `css`, then clicks it.
    pub async fn click(&self, what: &str, css: &str) {
        let target = self.wait_for(what, css).await;
        if let Err(e) = target.click().await {
            self.fail(&format!("{what}: click failed: {e}")).await;
        }
    }

    /// Waits for `css`, then types `text` into it (WebDriver key codes allowed).
    pub async fn type_into(&self, what: &str, css: &str, text: &str) {
        let target = self.wait_for(what, css).await;
        if let Err(e) = target.send_keys(text).await {
            self.fail(&format!("{what}: typing failed: {e}")).await;
        }
    }

    /// Sends keys to whatever has focus.
    pub async fn press(&self, keys: &str) {
        match self.client.active_element().await {
            Ok(focused) => {
                if let Err(e) = focused.send_keys(keys).await {
                    self.fail(&format!("key press failed: {e}")).await;
                }
            }
            Err(e) => self.fail(&format!("no focused element: {e}")).await,
        }
    }

    /// Saves a PNG screenshot as `artifacts/<name>.png` and returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let path = artifacts_dir().join(format!("{name}.png"));
        match self.client.screenshot().await {
            Ok(png) => {
                if let Err(e) = std::fs::write(&path, png) {
                    panic!("cannot write {}: {e}", path.display());
                }
            }
            Err(e) => panic!("screenshot failed: {e}"),
        }
        path
    }

    /// Runs axe-core on the page as it is now and returns its serious and critical
    /// violations (id, impact, help, and the offending elements).
    pub async fn accessibility_violations(&self) -> Vec<Value> {
        self.eval(&format!("{AXE}\n;return true;"), vec![]).await;
        let result = self
            .eval_async(
                "const done = arguments[arguments.length - 1];
                 axe.run(document, { resultTypes: ['violations'] }).then(
                   r => done(r.violations
                     .filter(v => v.impact === 'serious' || v.impact === 'critical')
                     .map(v => ({ id: v.id, impact: v.impact, help: v.help,
                                  nodes: v.nodes.map(n => n.html.slice(0, 200) + ' — ' + n.failureSummary) }))),
                   e => done([{ id: 'axe-failed', help: String(e) }]));",
                vec![],
            )
            .await;
        result.as_array().cloned().unwrap_or_default()
    }

    /// Fails with the violations when axe finds any serious or critical one.
    pub async fn assert_accessible(&self, when: &str) {
        let found = self.accessibility_violations().await;
        if !found.is_empty() {
            self.screenshot(&format!("FAILED-{}-a11y", self.name)).await;
            panic!(
                "{when}: {} serious accessibility violation(s):\n{}",
                found.len(),
                serde_json::to_string_pretty(&found).unwrap_or_default()
            );
        }
    }

    async fn fail(&self, what: &str) -> ! {
        let shot = self.screenshot(&format!("FAILED-{}", self.name)).await;
        let page = self
            .client
            .execute(
                "const log = document.getElementById('log'); return (log ? log.innerText : document.body.innerText).slice(-3000);",
                vec![],
            )
            .await
            .unwrap_or(Value::Null);
        panic!(
            "timed out after {DEADLINE:?} waiting for: {what}\nscreenshot: {}\npage:\n{}",
            shot.display(),
            page.as_str().unwrap_or_default()
        );
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

async fn wait_for_driver(url: &str) {
    let http = reqwest::Client::new();
    let started = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{url}/status")).send().await
            && let Ok(body) = r.json::<Value>().await
            && body["value"]["ready"] == true
        {
            return;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "chromedriver did not become ready at {url}"
        );
        tokio::time::sleep(POLL).await;
    }
}
