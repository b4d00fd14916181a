//! The admin page as a browser renders it: headless Chromium loads the
//! page from the admin gateway example (`examples/admin_gateway/app.rs`,
//! the wiring `cargo run --example admin_gateway` runs) over loopback,
//! and the test reads the rendered document through the DevTools protocol
//! (over `--remote-debugging-pipe`), not the HTML source: a tripped
//! breaker's row shows "open", a hostile name renders as text and runs
//! nothing, and a transition made after the page loaded appears without a
//! reload. A screenshot of the page is kept in the target directory
//! (`admin-page.png`).
//!
//! Chromium is found as `$CHROMIUM`, or `chromium` on `PATH`
//! (`bash .ci/chromium` installs Debian's package); without it the test
//! fails, saying so. Real sockets and a real browser run on real time:
//! every wait is bounded and fails the test with what it waited for.
#![cfg(feature = "admin")]

// The example's traffic schedule is the example's alone.
#[allow(dead_code)]
#[path = "../examples/admin_gateway/app.rs"]
mod app;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tower_circuit_breaker::State;

const HOSTILE: &str = "<img src=x onerror=alert(1)>";
const HOSTILE_SCRIPT: &str = "\"><script>alert(2)</script>";
/// How long the browser may take to show what a check waits for.
const PATIENCE: Duration = Duration::from_secs(30);

/// `$CHROMIUM`, or the first `chromium` (or `chromium-browser`) on `PATH`.
fn chromium() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the admin page's browser test needs Chromium: install it \
                 (`bash .ci/chromium`, or on Debian `apt-get install -y chromium`) \
                 or set CHROMIUM to a Chromium or Chrome binary"
            )
        })
}

/// A headless Chromium driven through the DevTools protocol on a pipe:
/// JSON messages, each ended by a NUL byte, in on its descriptor 3 and out
/// on its descriptor 4. The browser is killed when this is dropped.
struct Browser {
    child: Child,
    commands: ChildStdin,
    replies: BufReader<ChildStdout>,
    next_id: u64,
    /// The page's session (flat mode: its commands carry it).
    session: Option<String>,
    profile: PathBuf,
}

impl Browser {
    async fn launch(profile: PathBuf, log: &Path) -> Browser {
        let binary = chromium();
        let log = std::fs::File::create(log).expect("a log file for the browser");
        // The shell hands the pipes to Chromium as descriptors 3 and 4,
        // where `--remote-debugging-pipe` expects them.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(&binary)
            .args([
                "--headless",
                // As root (CI), Chromium starts only without its sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--hide-scrollbars",
                "--window-size=1400,900",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let commands = child.stdin.take().expect("the command pipe");
        let replies = BufReader::new(child.stdout.take().expect("the reply pipe"));
        Browser {
            child,
            commands,
            replies,
            next_id: 0,
            session: None,
            profile,
        }
    }

    /// Sends `method` and waits for its reply, passing over events.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = &self.session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("a command");
        bytes.push(0);
        let reply = tokio::time::timeout(PATIENCE, async {
            self.commands.write_all(&bytes).await?;
            self.commands.flush().await?;
            loop {
                let mut buffer = Vec::new();
                if self.replies.read_until(0, &mut buffer).await? == 0 {
                    return Err(std::io::Error::other("the browser closed its pipe"));
                }
                buffer.pop();
                let reply: Value =
                    serde_json::from_slice(&buffer).map_err(std::io::Error::other)?;
                if reply["id"] == id {
                    return Ok(reply);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the browser did not answer {method} in {PATIENCE:?}"))
        .unwrap_or_else(|e| panic!("{method}: {e}"));
        if let Some(error) = reply.get("error") {
            panic!("{method} failed: {error}");
        }
        reply["result"].clone()
    }

    /// Opens a page and attaches to it: later commands go to the page.
    async fn open_page(&mut self) {
        let target = self
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = self
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        self.session = Some(
            attached["sessionId"]
                .as_str()
                .expect("a session id")
                .to_string(),
        );
    }

    /// The value of `expression`, evaluated in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        if let Some(thrown) = result.get("exceptionDetails") {
            panic!("{expression} threw: {thrown}");
        }
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is `true` in the page, failing the test
    /// with `what` after [`PATIENCE`].
    async fn wait_for(&mut self, what: &str, expression: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        // Before the page has loaded, the elements asked about are missing.
        let check = format!("(() => {{ try {{ return ({expression}) === true; }} catch (_) {{ return false; }} }})()");
        loop {
            if self.eval(&check).await == json!(true) {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                let shown = self.eval("document.body.innerText").await;
                panic!("the page did not show {what} in {PATIENCE:?}; it shows:\n{shown}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The page as a PNG.
    async fn screenshot(&mut self) -> Vec<u8> {
        let shot = self
            .call(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": false }),
            )
            .await;
        base64(shot["data"].as_str().expect("base64 image data"))
    }

    async fn close(mut self) {
        self.session = None;
        let _ = tokio::time::timeout(
            Duration::from_secs(5),
            self.call("Browser.close", json!({})),
        )
        .await;
        let _ = self.child.kill().await;
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Decodes standard base64 (the protocol's binary data).
fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {:?}", c as char),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    digits
        .chunks(4)
        .flat_map(|chunk| {
            let bits = chunk
                .iter()
                .enumerate()
                .fold(0u32, |bits, (i, &d)| bits | u32::from(d) << (18 - 6 * i));
            let bytes = bits.to_be_bytes();
            bytes[1..chunk.len()].to_vec()
        })
        .collect()
}

/// A script that is `true` once the row of breaker `name` shows `state`.
fn row_shows(name: &str, state: &str) -> String {
    format!(
        "(() => {{ const row = [...document.querySelectorAll('#rows tr')]
             .find((tr) => tr.dataset.name === {name});
           return !!row && row.querySelector('td.state').textContent === {state}; }})()",
        name = json!(name),
        state = json!(state),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_open_breakers_hostile_names_as_text_and_transitions_without_a_reload() {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let running = app::start().await.expect("the example's gateway");
    let gateway = running.gateway;

    // A model that fails until its breaker opens, healthy ones, and models
    // whose names, taken from the request path, are markup.
    for model in ["openai/mini", "anthropic/claude", HOSTILE, HOSTILE_SCRIPT] {
        let status = app::complete_via(gateway, model).await.unwrap();
        assert_eq!(status, StatusCode::OK, "{model}");
    }
    running.upstream.set_failing("openai/gpt-x", true);
    for _ in 0..app::THRESHOLD {
        let status = app::complete_via(gateway, "openai/gpt-x").await.unwrap();
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let gpt_x = running.registry.get(&"openai/gpt-x".to_string()).unwrap();
    assert_eq!(gpt_x.state(), State::Open);

    let mut browser = Browser::launch(
        target.join(format!("admin-browser-profile-{}", std::process::id())),
        &target.join("admin-browser.log"),
    )
    .await;
    browser.open_page().await;
    // Were any script of a name to run, `alert` would leave this mark.
    browser
        .call(
            "Page.addScriptToEvaluateOnNewDocument",
            json!({ "source": "window.alert = () => { document.documentElement.dataset.alerted = 'yes'; };" }),
        )
        .await;
    let url = format!("http://{gateway}/admin");
    let navigated = browser.call("Page.navigate", json!({ "url": url })).await;
    assert!(navigated.get("errorText").is_none(), "{navigated}");

    browser
        .wait_for(
            "the breakers, with the event stream connected",
            "document.body.dataset.loaded === 'yes' && document.getElementById('live').className === 'on'",
        )
        .await;
    browser
        .wait_for(
            "openai/gpt-x's row in state open",
            &row_shows("openai/gpt-x", "open"),
        )
        .await;
    browser
        .wait_for(
            "anthropic/claude's row in state closed",
            &row_shows("anthropic/claude", "closed"),
        )
        .await;

    for hostile in [HOSTILE, HOSTILE_SCRIPT] {
        browser
            .wait_for(&format!("{hostile}'s row"), &row_shows(hostile, "closed"))
            .await;
        let shown = browser
            .eval(&format!(
                "[...document.querySelectorAll('#rows tr')].find((tr) => tr.dataset.name === {})
                    .querySelector('.breaker-name').textContent",
                json!(hostile)
            ))
            .await;
        assert_eq!(shown, json!(hostile), "the name, as text");
    }
    let made = browser
        .eval(
            "({ images: document.querySelectorAll('img').length,
                scripts: document.querySelectorAll('script').length,
                alerted: document.documentElement.dataset.alerted || null })",
        )
        .await;
    assert_eq!(
        made,
        json!({ "images": 0, "scripts": 1, "alerted": null }),
        "no element was made from a name, and nothing ran"
    );

    // A transition after the page loaded: claude fails until it opens. A
    // reload would forget the mark left in the page.
    browser.eval("window.sameDocument = true").await;
    running.upstream.set_failing("anthropic/claude", true);
    for _ in 0..app::THRESHOLD {
        app::complete_via(gateway, "anthropic/claude")
            .await
            .unwrap();
    }
    let claude = running
        .registry
        .get(&"anthropic/claude".to_string())
        .unwrap();
    assert_eq!(claude.state(), State::Open);
    browser
        .wait_for(
            "the transition of anthropic/claude in the list",
            "[...document.querySelectorAll('#transitions li')].some((li) =>
                li.dataset.breaker === 'anthropic/claude' && li.textContent.includes('closed → open'))",
        )
        .await;
    browser
        .wait_for(
            "anthropic/claude's row in state open",
            &row_shows("anthropic/claude", "open"),
        )
        .await;
    // Counts follow: the page asks for a fresh page after a transition.
    browser
        .wait_for(
            "two open breakers in the summary",
            "[...document.querySelectorAll('#summary .chip')].some((chip) => chip.textContent === 'open 2')",
        )
        .await;
    assert_eq!(
        browser.eval("window.sameDocument === true").await,
        json!(true),
        "the page was not reloaded"
    );

    let png = browser.screenshot().await;
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let path = target.join("admin-page.png");
    std::fs::write(&path, png).expect("the screenshot written");
    println!("screenshot: {}", path.display());
    browser.close().await;
}

/// `admin` served on loopback under `/admin`, and a browser (its profile
/// and log named after `run`) showing its page.
async fn admin_page(admin: axum::Router, run: &str) -> Browser {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let addr = app::serve(axum::Router::new().nest("/admin", admin))
        .await
        .expect("the admin on loopback");
    let mut browser = Browser::launch(
        target.join(format!("admin-browser-{run}-{}", std::process::id())),
        &target.join(format!("admin-browser-{run}.log")),
    )
    .await;
    browser.open_page().await;
    let navigated = browser
        .call(
            "Page.navigate",
            json!({ "url": format!("http://{addr}/admin") }),
        )
        .await;
    assert!(navigated.get("errorText").is_none(), "{navigated}");
    browser
}

/// Breakers named `.` and `..`, which a browser would drop from a path as
/// dot segments, are held open by the page's own buttons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buttons_control_breakers_named_dot_and_dot_dot() {
    use tower_circuit_breaker::admin::Admin;
    use tower_circuit_breaker::{Breaker, Config};

    let named = |name: &str| Breaker::new(Config::builder().name(name).build().unwrap());
    let (dot, dot_dot, plain) = (named("."), named(".."), named("plain"));
    let admin = Admin::new(vec![dot.clone(), dot_dot.clone(), plain.clone()])
        .control(true)
        .router();
    let mut browser = admin_page(admin, "dots").await;
    for name in [".", ".."] {
        browser
            .wait_for(&format!("{name}'s row"), &row_shows(name, "closed"))
            .await;
        let clicked = browser
            .eval(&format!(
                "(() => {{ const row = [...document.querySelectorAll('#rows tr')]
                     .find((tr) => tr.dataset.name === {name});
                   const button = [...row.querySelectorAll('button')]
                     .find((b) => b.textContent === 'Hold open');
                   if (!button) return false;
                   button.click();
                   return true; }})()",
                name = json!(name)
            ))
            .await;
        assert_eq!(clicked, json!(true), "{name}'s row has a Hold open button");
        browser
            .wait_for(
                &format!("{name}'s row held open"),
                &row_shows(name, "forced open"),
            )
            .await;
    }
    assert_eq!(dot.state(), State::ForcedOpen);
    assert_eq!(dot_dot.state(), State::ForcedOpen);
    assert_eq!(plain.state(), State::Closed, "no other breaker was touched");
    browser.close().await;
}

/// With a fleet store and the fleet-wide switch on, the page's button
/// holds open every instance's breaker of the name, not only this one's;
/// the fleet button shows the fleet's view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_wide_switch_makes_a_button_act_on_every_instance() {
    use tower_circuit_breaker::admin::Admin;
    use tower_circuit_breaker::store::memory::MemoryFleet;
    use tower_circuit_breaker::{Breaker, Config};

    let memory = MemoryFleet::builder().build().unwrap();
    let (here, there) = (memory.named_instance("gw-1"), memory.named_instance("gw-2"));
    let named = || Breaker::new(Config::builder().name("openai").build().unwrap());
    let (ours, theirs) = (named(), named());
    assert!(here.attach(&ours) && there.attach(&theirs));
    let admin = Admin::new(vec![ours.clone()])
        .fleet(&here)
        .control(true)
        .router();
    let mut browser = admin_page(admin, "fleet").await;
    browser
        .wait_for("openai's row", &row_shows("openai", "closed"))
        .await;
    let click = |label: &str| {
        format!(
            "(() => {{ const row = [...document.querySelectorAll('#rows tr')]
                 .find((tr) => tr.dataset.name === 'openai');
               const button = [...row.querySelectorAll('button')]
                 .find((b) => b.textContent === {label});
               if (!button) return false;
               button.click();
               return true; }})()",
            label = json!(label)
        )
    };
    let switched = browser
        .eval(
            "(() => { const s = document.getElementById('fleet-switch');
               if (!s || s.closest('[hidden]')) return false;
               s.checked = true; return true; })()",
        )
        .await;
    assert_eq!(switched, json!(true), "the fleet-wide switch is shown");
    assert_eq!(browser.eval(&click("Hold open")).await, json!(true));
    browser
        .wait_for("openai held open", &row_shows("openai", "forced open"))
        .await;
    assert_eq!(ours.state(), State::ForcedOpen);
    assert_eq!(theirs.state(), State::ForcedOpen, "the other instance too");

    assert_eq!(browser.eval(&click("Fleet")).await, json!(true));
    browser
        .wait_for(
            "the fleet's view",
            "document.getElementById('notice').textContent.includes('held fleet-wide: forced open')",
        )
        .await;
    browser.close().await;
}

#[test]
fn base64_decodes_as_the_standard_alphabet_says() {
    assert_eq!(base64("aGVsbG8="), b"hello");
    assert_eq!(base64("aGVsbG8hIQ=="), b"hello!!");
    assert_eq!(base64("+/8A"), [0xfb, 0xff, 0x00]);
}
