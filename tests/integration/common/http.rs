//! A minimal HTTP/1.1 client for the tests of the HTTP server (raw
//! requests, so that what the server answers is seen byte for byte).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One HTTP/1.1 request (Connection: close); returns status and body.
pub fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    try_request(addr, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path} on {addr}: {e}"))
}

/// [`request`] to a server that may not be there (not yet started, or
/// exiting): the connection's error instead of a panic.
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other("no response head"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status"))?;
    let body =
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { unchunk(rest) } else { rest.into() };
    Ok((code, body))
}

fn unchunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = s.split_once("\r\n").expect("chunk size");
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            return out;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
}

/// Drives the exception panel at `url` in headless Chromium
/// (tests/browser/panel.mjs): finds `operation_id` in the queue, resolves
/// it with `decision` (a wrong token first), screenshots into
/// `CARGO_TARGET_TMPDIR/{shots}`. Returns the script's JSON result.
pub fn drive_panel(url: &str, operation_id: &str, decision: &str, token: &str, shots: &str) -> serde_json::Value {
    browser_script("panel.mjs", &[url, operation_id, decision, token], shots)
}

/// Drives the panel's Dead letters tab in headless Chromium
/// (tests/browser/dlq.mjs): selects a dead letter of each place, dry run,
/// re-drive with `token`, screenshots into `CARGO_TARGET_TMPDIR/{shots}`.
/// Returns the script's JSON result.
pub fn drive_dlq_tab(url: &str, token: &str, shots: &str) -> serde_json::Value {
    browser_script("dlq.mjs", &[url, token], shots)
}

/// Opens the panel at `url` that `reconciler demo` left running, in
/// headless Chromium (tests/browser/demo.mjs): the queue has cases, and
/// each `(operation, outcome)` opens showing that outcome. Returns the
/// script's JSON result.
pub fn drive_demo_panel(url: &str, cases: &[(String, String)], shots: &str) -> serde_json::Value {
    let args: Vec<String> =
        std::iter::once(url.to_owned()).chain(cases.iter().map(|(op, outcome)| format!("{op}={outcome}"))).collect();
    browser_script("demo.mjs", &args.iter().map(String::as_str).collect::<Vec<_>>(), shots)
}

/// Runs `tests/browser/{script}` with `args` and the screenshot directory;
/// its last line of output, as JSON.
fn browser_script(script: &str, args: &[&str], shots: &str) -> serde_json::Value {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    assert!(
        dir.join("node_modules/playwright-core").exists(),
        "tests/browser/node_modules is missing: run scripts/setup.sh --tests (npm ci)"
    );
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(shots);
    let out = std::process::Command::new("node")
        .arg(dir.join(script))
        .args(args)
        .arg(&shots)
        .output()
        .expect("node runs (scripts/setup.sh --tests installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the browser script {script} failed at {}: {stdout}\n{}",
        args[0],
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{script} printed no JSON ({e}): {stdout}"))
}
