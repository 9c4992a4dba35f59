//! Hostile MCP servers against the gateway (docs/mcp.md: "a hostile server
//! (a huge listing, an endless stream, malformed JSON-RPC) meets the same
//! bounds as a hostile backend"). Each test puts the SDK's own server,
//! `good`, and one or more hostile ones (harness/mcp_hostile.py) behind one
//! route, drives the real gateway with raw HTTP (initialize, the session id
//! header, then tools/list or tools/call), and checks what the client sees
//! (a JSON-RPC error naming the server, a listing cut at its bound, a
//! stream ended after its idle time), that the hostile server's connection
//! is let go, that `good` is still served on the same route and that the
//! gateway's memory stays bounded.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{Value, json};
use sluice_tests::{ConfigDir, Gateway, HostileMcpServer, McpServer, Options, Reply, documents, eventually};

const MIB: u64 = 1024 * 1024;
/// How much the gateway's resident memory may grow over an attack.
const RSS_BOUND: u64 = 200 * MIB;
/// JSON-RPC's code for a server that failed or answered badly.
const UPSTREAM_ERROR: i64 = -32002;
const VERSION: &str = "2025-11-25";

struct Setup {
    good: McpServer,
    hostile: Vec<HostileMcpServer>,
    gateway: Gateway,
    _dir: ConfigDir,
}

/// `good` (the SDK's server) and hostile servers `(name, listing mode)`,
/// each with `timeoutMs: 1000`, behind a route per `(path, limits)`.
async fn setup(hostile: &[(&str, &str)], routes: &[(&str, &str)]) -> Setup {
    let hostile: Vec<(&str, [&str; 2])> =
        hostile.iter().map(|(name, listing)| (*name, ["--listing", listing])).collect();
    let hostile: Vec<(&str, &[&str])> = hostile.iter().map(|(name, args)| (*name, &args[..])).collect();
    setup_with(&hostile, routes).await
}

/// [`setup`], each hostile server started with its own arguments.
async fn setup_with(hostile: &[(&str, &[&str])], routes: &[(&str, &str)]) -> Setup {
    setup_timed(hostile, routes, 1000).await
}

/// [`setup_with`], the hostile servers' `timeoutMs` given.
async fn setup_timed(hostile: &[(&str, &[&str])], routes: &[(&str, &str)], timeout_ms: u64) -> Setup {
    let good = McpServer::start("good").await;
    let started = hostile.iter().map(|(name, args)| HostileMcpServer::start_with(name, args));
    let servers_of_hostile: Vec<HostileMcpServer> = futures_util::future::join_all(started).await;
    let mut servers = vec![format!("    - {{name: good, url: \"{}\"}}", good.url())];
    for ((name, _), server) in hostile.iter().zip(&servers_of_hostile) {
        servers.push(format!("    - {{name: {name}, url: \"{}\", timeoutMs: {timeout_ms}}}", server.url()));
    }
    let docs: Vec<String> = routes
        .iter()
        .map(|(path, limits)| {
            let name = path.trim_start_matches('/');
            let limits = if limits.is_empty() { String::new() } else { format!("  limits: {limits}\n") };
            format!(
                "apiVersion: sluice.dev/v1alpha1\nkind: MCPRoute\nmetadata: {{name: {name}}}\nspec:\n  path: {path}\n  servers:\n{}\n{limits}",
                servers.join("\n")
            )
        })
        .collect();
    let dir = ConfigDir::new();
    dir.write("mcp.yaml", &documents(&docs));
    // Messages up to 16 MiB: a route's maxMessageBytes is bounded by the
    // gateway's --mcp-max-message-bytes and --max-body-bytes (4 MiB each by
    // default).
    let options = Options {
        max_body_bytes: Some(16 * MIB as usize),
        args: vec!["--mcp-max-message-bytes".into(), (16 * MIB).to_string()],
        ..Default::default()
    };
    let gateway = Gateway::start_with(&dir, options).await;
    Setup { good, hostile: servers_of_hostile, gateway, _dir: dir }
}

impl Setup {
    /// The gateway is up, ready, and still serves `good` on `path`, in a
    /// new session and in `session` if given.
    async fn still_serves_good(&self, path: &str, session: Option<&Session<'_>>) {
        // A zombie has no resident memory.
        assert!(self.gateway.rss_bytes() > 0, "the gateway died:\n{}", self.gateway.log());
        assert_eq!(self.gateway.readyz().await, 200);
        let fresh = Session::open(&self.gateway, path).await;
        for session in [Some(&fresh), session].into_iter().flatten() {
            let reply = session.call(900, "good__echo", json!({"text": "still here"})).await;
            assert_eq!(text_of(&answer_of(&reply, &json!(900))), "good:still here", "{}", self.good.log());
        }
    }

    /// The hostile server `at`'s statistics once `done` holds of them
    /// (within 10 s).
    async fn hostile_stats_once(&self, at: usize, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let server = &self.hostile[at];
        eventually(what, Duration::from_secs(10), async || {
            let stats = server.stats().await;
            done(&stats).then_some(stats)
        })
        .await
    }

    fn assert_rss_within_bound(&self, before: u64) {
        let after = self.gateway.rss_bytes();
        assert!(after < before + RSS_BOUND, "the gateway's RSS grew from {} MiB to {} MiB", before / MIB, after / MIB);
    }
}

/// A session with the gateway, opened with raw HTTP.
struct Session<'a> {
    gateway: &'a Gateway,
    path: String,
    id: String,
}

impl<'a> Session<'a> {
    /// POSTs `initialize` (its answer must carry a session id), then
    /// `notifications/initialized` (202).
    async fn open(gateway: &'a Gateway, path: &str) -> Session<'a> {
        let initialize = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "e2e-hostile", "version": "1"}}});
        let reply =
            gateway.post(path, initialize.to_string(), &[("accept", "application/json, text/event-stream")]).await;
        assert_eq!(reply.status, 200, "initialize: {}", reply.text());
        let id = reply.header("mcp-session-id").unwrap_or_else(|| panic!("no session id: {reply:?}")).to_string();
        let answer = reply.json();
        assert_eq!(answer["result"]["serverInfo"]["name"], "sluice", "{answer}");
        assert_eq!(answer["result"]["protocolVersion"], VERSION, "{answer}");
        let session = Session { gateway, path: path.into(), id };
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let reply = gateway.post(path, initialized.to_string(), &session.headers()).await;
        assert_eq!(reply.status, 202, "notifications/initialized: {}", reply.text());
        session
    }

    fn headers(&self) -> [(&str, &str); 3] {
        [
            ("accept", "application/json, text/event-stream"),
            ("mcp-session-id", &self.id),
            ("mcp-protocol-version", VERSION),
        ]
    }

    fn message(id: u64, method: &str, params: Value) -> String {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    }

    /// POSTs request `id` and reads the whole reply.
    async fn request(&self, id: u64, method: &str, params: Value) -> Reply {
        self.gateway.post(&self.path, Session::message(id, method, params), &self.headers()).await
    }

    async fn call(&self, id: u64, tool: &str, arguments: Value) -> Reply {
        self.request(id, "tools/call", json!({"name": tool, "arguments": arguments})).await
    }

    /// `tools/call` on a connection of its own, its reply read as it
    /// comes; dropping it closes the connection.
    async fn open_stream(&self, id: u64, tool: &str, arguments: Value) -> Stream {
        let addr: SocketAddr =
            self.gateway.url("").trim_start_matches("http://").parse().expect("the gateway's address");
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connecting to the gateway");
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(hyper_util::rt::TokioIo::new(tcp))
                .await
                .expect("an HTTP/1.1 handshake");
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let body = Session::message(id, "tools/call", json!({"name": tool, "arguments": arguments}));
        let mut request = hyper::Request::post(&self.path)
            .header("host", addr.to_string())
            .header("content-type", "application/json");
        for (name, value) in self.headers() {
            request = request.header(name, value);
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("a valid request");
        let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
            .await
            .unwrap_or_else(|_| panic!("no response head for {tool} in 10 s"))
            .unwrap_or_else(|e| panic!("{tool}: {e}"));
        let (head, body) = response.into_parts();
        Stream { status: head.status.as_u16(), headers: head.headers, body, pending: String::new(), connection }
    }
}

/// A reply read as it streams; its connection closes when dropped.
struct Stream {
    status: u16,
    headers: http::HeaderMap,
    body: Incoming,
    pending: String,
    connection: tokio::task::JoinHandle<()>,
}

impl Stream {
    /// The next JSON-RPC message of the SSE stream (events without data
    /// skipped), within `within`; `None` once the stream ends.
    async fn next(&mut self, within: Duration) -> Option<Value> {
        loop {
            if let Some(end) = self.pending.find("\n\n") {
                let event: String = self.pending.drain(..end + 2).collect();
                if let Some(message) = message_of_event(&event) {
                    return Some(message);
                }
                continue;
            }
            let frame = tokio::time::timeout(within, self.body.frame())
                .await
                .unwrap_or_else(|_| panic!("no event in {within:?}; so far: {:?}", self.pending))?;
            if let Ok(data) = frame.expect("reading the stream").into_data() {
                self.pending.push_str(std::str::from_utf8(&data).expect("the gateway's SSE is UTF-8"));
            }
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// The JSON-RPC message in one SSE event; `None` for an event with no
/// data. Panics if the data is not JSON: the gateway relays only messages.
fn message_of_event(event: &str) -> Option<Value> {
    let data: Vec<&str> =
        event.lines().filter_map(|line| line.strip_prefix("data:").map(|d| d.strip_prefix(' ').unwrap_or(d))).collect();
    if data.is_empty() {
        return None;
    }
    let data = data.join("\n");
    Some(
        serde_json::from_str(&data)
            .unwrap_or_else(|e| panic!("the gateway relayed an event that is not JSON ({e}): {data:?}")),
    )
}

/// The JSON-RPC messages of a reply: its JSON body, or its SSE events'.
fn messages(reply: &Reply) -> Vec<Value> {
    let content_type = reply.header("content-type").unwrap_or_default();
    if content_type.starts_with("text/event-stream") {
        let text = reply.text().replace("\r\n", "\n");
        let mut events: Vec<&str> = text.split("\n\n").collect();
        assert_eq!(events.pop(), Some(""), "the stream ended mid-event: {text:?}");
        events.into_iter().filter_map(message_of_event).collect()
    } else {
        assert!(content_type.starts_with("application/json"), "content type {content_type}: {}", reply.text());
        vec![reply.json()]
    }
}

/// The answer to request `id` in a reply, which ends with it.
fn answer_of(reply: &Reply, id: &Value) -> Value {
    assert_eq!(reply.status, 200, "{}", reply.text());
    let all = messages(reply);
    let last = all.last().unwrap_or_else(|| panic!("no message in the reply: {reply:?}"));
    assert_eq!(&last["id"], id, "the reply does not end with the answer to {id}: {all:?}");
    assert!(last.get("method").is_none() && (last.get("result").is_some() ^ last.get("error").is_some()), "{last}");
    assert_eq!(last["jsonrpc"], "2.0", "{last}");
    last.clone()
}

fn text_of(answer: &Value) -> &str {
    answer["result"]["content"][0]["text"].as_str().unwrap_or_else(|| panic!("no text content: {answer}"))
}

/// Asserts `answer` is the gateway's error for a server that failed, naming
/// `server` and saying `why`.
fn assert_server_error(answer: &Value, server: &str, why: &str) {
    assert_eq!(answer["error"]["code"], UPSTREAM_ERROR, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_else(|| panic!("no error message: {answer}"));
    assert!(message.contains(&format!("server `{server}`")), "the error does not name {server}: {message}");
    assert!(message.contains(why), "the error does not say `{why}`: {message}");
}

fn tool_names(answer: &Value) -> Vec<String> {
    let tools = answer["result"]["tools"].as_array().unwrap_or_else(|| panic!("no tools listed: {answer}"));
    tools.iter().map(|t| t["name"].as_str().unwrap_or_else(|| panic!("a tool with no name: {t}")).to_string()).collect()
}

/// The gateway's peak resident memory so far (VmHWM), in bytes.
fn peak_rss(gateway: &Gateway) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gateway.pid())).expect("reading /proc");
    let kib = status.lines().find_map(|line| line.strip_prefix("VmHWM:")).expect("a VmHWM line");
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().expect("VmHWM in kB") * 1024
}

async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let value = future.await;
    (value, started.elapsed())
}

#[tokio::test]
async fn a_huge_listing_is_cut_at_max_tools_and_an_endless_cursor_at_64_pages() {
    let setup = setup(
        &[("pages", "endless-cursor"), ("huge", "huge")],
        &[("/mcp", "{maxMessageBytes: 8388608, maxTools: 1000}"), ("/small", "{maxMessageBytes: 65536}")],
    )
    .await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let rss_before = setup.gateway.rss_bytes();
    let mut rss_after = Vec::new();
    for round in 0..5 {
        let (reply, took) = timed(session.request(round, "tools/list", json!({}))).await;
        assert!(took < Duration::from_secs(20), "the listing took {took:?}");
        rss_after.push(setup.gateway.rss_bytes());
        let tools = tool_names(&answer_of(&reply, &json!(round)));
        assert_eq!(tools.len(), 1000, "the listing is not cut at maxTools");
        let good = tools.iter().filter(|t| t.starts_with("good__")).count();
        assert!(tools.contains(&"good__echo".to_string()), "{:?}", &tools[..good]);
        // One tool a page, a next cursor on each: at most 64 pages read, in
        // order, and no more than its timeout (1 s) allows; those read are
        // kept.
        let pages: Vec<&String> = tools.iter().filter(|t| t.starts_with("pages__")).collect();
        let expected: Vec<String> = (0..pages.len()).map(|page| format!("pages__page{page}")).collect();
        assert!(!pages.is_empty() && pages.len() <= 64, "{} pages", pages.len());
        assert_eq!(pages, expected.iter().collect::<Vec<_>>());
        let good = good + pages.len();
        // The 100000 tools of `huge`'s one page fill what is left, in its order.
        let huge: Vec<&String> = tools.iter().filter(|t| t.starts_with("huge__")).collect();
        assert_eq!(huge.len(), 1000 - good);
        assert_eq!(
            (huge[0].as_str(), huge[huge.len() - 1].as_str()),
            ("huge__t0", &*format!("huge__t{}", huge.len() - 1))
        );
    }
    let stats = setup.hostile[0].stats().await;
    let pages_asked = stats["requests"]["tools/list"].as_u64().unwrap_or_default();
    assert!((5..=5 * 64).contains(&pages_asked), "{stats}");
    assert!(setup.gateway.wait_for_log("an MCP listing was cut at its limit").await, "{}", setup.gateway.log());
    // Memory: a listing costs what parsing its page does (a 5.5 MB page
    // of small tools costs a hundred MiB or more: see the concurrent test
    // below), and no more for the next ones.
    let mib: Vec<u64> = rss_after.iter().map(|rss| rss / MIB).collect();
    assert!(rss_after[4] < rss_after[1] + 64 * MIB, "the gateway's RSS grows listing after listing: {mib:?} MiB");
    assert!(rss_after[4] < rss_before + 2 * RSS_BOUND, "RSS {} MiB before, then {mib:?} MiB", rss_before / MIB);

    // On a route whose messages are at most 64 KiB, `huge`'s one page is
    // over the bound: it is left out, the others listed.
    let small = Session::open(&setup.gateway, "/small").await;
    let tools = tool_names(&answer_of(&small.request(7, "tools/list", json!({})).await, &json!(7)));
    assert!(tools.contains(&"good__echo".to_string()), "{tools:?}");
    assert!((1..=64).contains(&tools.iter().filter(|t| t.starts_with("pages__")).count()), "{tools:?}");
    assert!(!tools.iter().any(|t| t.starts_with("huge__")), "{tools:?}");
    assert!(setup.gateway.wait_for_log("its answer is over 65536 bytes").await, "{}", setup.gateway.log());
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// maxMessageBytes bounds the bytes read, but a listing page is parsed
/// whole into a tree several times its size before maxTools cuts it: a
/// page just under the default 4 MiB of 75000 small tools costs some
/// 30 MiB. Sixteen clients listing at once must stay within the bound.
#[tokio::test]
async fn concurrent_listings_just_under_max_message_bytes_stay_within_the_memory_bound() {
    // Time enough (30 s) for sixteen pages of 4 MiB from one Python server
    // on two cores: the bound under test is memory, not time.
    let setup = setup_timed(&[("huge", &["--listing", "huge", "--tools", "75000"])], &[("/mcp", "")], 30_000).await;
    let sessions: Vec<Session> =
        futures_util::future::join_all((0..16).map(|_| Session::open(&setup.gateway, "/mcp"))).await;
    let rss_before = setup.gateway.rss_bytes();
    let listed = sessions.iter().map(|session| session.request(1, "tools/list", json!({})));
    for reply in futures_util::future::join_all(listed).await {
        let tools = tool_names(&answer_of(&reply, &json!(1)));
        assert_eq!(tools.len(), 1024, "cut at the default maxTools");
    }
    let peak = peak_rss(&setup.gateway);
    assert!(
        peak < rss_before + RSS_BOUND,
        "the gateway's RSS peaked at {} MiB from {} MiB",
        peak / MIB,
        rss_before / MIB
    );
}

#[tokio::test]
async fn malformed_or_silent_listings_leave_only_their_server_out() {
    let setup = setup(&[("nojson", "not-json"), ("silent", "slow-head")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let (reply, took) = timed(session.request(1, "tools/list", json!({}))).await;
    let tools = tool_names(&answer_of(&reply, &json!(1)));
    // `silent` held the listing for its timeout (1 s), no longer.
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "the listing took {took:?}");
    assert!(tools.contains(&"good__echo".to_string()), "{tools:?}");
    assert!(tools.iter().all(|t| t.starts_with("good__")), "{tools:?}");
    for said in ["server `nojson` sent a bad answer", "server `silent` did not answer within 1000 ms"] {
        assert!(setup.gateway.wait_for_log(said).await, "{said} not in\n{}", setup.gateway.log());
    }
    // The gateway let go of the request `silent` never answered.
    setup.hostile_stats_once(1, "`silent` to see its request dropped", |s| s["closed_streams"] == 1).await;
    setup.still_serves_good("/mcp", Some(&session)).await;
}

#[tokio::test]
async fn an_answer_over_max_message_bytes_is_an_error_as_json_and_as_sse() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "{maxMessageBytes: 65536}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    // Under the bound, an answer passes whole.
    let small = answer_of(&session.call(1, "hostile__huge_json", json!({"bytes": 60000})).await, &json!(1));
    assert_eq!(text_of(&small).len(), 60000);

    let rss_before = setup.gateway.rss_bytes();
    for round in 0..5 {
        let id = 10 + 2 * round;
        // 8 MiB offered in one JSON body.
        let reply = session.call(id, "hostile__huge_json", json!({"bytes": 8 * MIB})).await;
        assert_eq!(reply.header("content-type"), Some("application/json"));
        assert_server_error(&answer_of(&reply, &json!(id)), "hostile", "larger than 65536 bytes");
        // 8 MiB offered as one SSE event that never ends.
        let reply = session.call(id + 1, "hostile__huge_sse_unterminated", json!({"bytes": 8 * MIB})).await;
        assert_eq!(reply.header("content-type"), Some("text/event-stream"));
        let all = messages(&reply);
        assert_eq!(all.len(), 1, "{all:?}");
        assert_server_error(&answer_of(&reply, &json!(id + 1)), "hostile", "a message over 65536 bytes");
    }
    setup.assert_rss_within_bound(rss_before);
    // Each cut stream's connection was closed, none left open.
    setup
        .hostile_stats_once(0, "the cut streams to close", |s| s["open_streams"] == 0 && s["closed_streams"] == 5)
        .await;
    setup.still_serves_good("/mcp", Some(&session)).await;
}

#[tokio::test]
async fn one_sse_event_over_max_message_bytes_written_at_once_is_an_error() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "{maxMessageBytes: 65536}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let reply = session.call(1, "hostile__huge_sse", json!({"bytes": 200_000})).await;
    assert!(reply.body.len() < 65536, "{} bytes reached the client past a 65536-byte bound", reply.body.len());
    assert_server_error(&answer_of(&reply, &json!(1)), "hostile", "a message over 65536 bytes");
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// The bound on one message holds however its bytes arrive: here all but
/// the last 100 bytes of a 65586-byte message come first (under the bound,
/// no end yet), then the rest with the event's end in one small frame.
#[tokio::test]
async fn one_sse_event_just_over_max_message_bytes_is_an_error_however_it_arrives() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "{maxMessageBytes: 65536}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let reply = session.call(1, "hostile__sse_just_over", json!({"bytes": 65536 + 50})).await;
    assert!(reply.body.len() < 65536, "{} bytes reached the client past a 65536-byte bound", reply.body.len());
    assert_server_error(&answer_of(&reply, &json!(1)), "hostile", "a message over 65536 bytes");
    setup.still_serves_good("/mcp", Some(&session)).await;
}

#[tokio::test]
async fn a_server_silent_after_its_head_is_cut_at_the_stream_idle_timeout() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "{streamIdleTimeoutMs: 1000}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let other = Session::open(&setup.gateway, "/mcp").await;
    // Eight silent streams, and meanwhile `good` answers another session.
    let silent = (0..8).map(|id| timed(session.call(id, "hostile__idle_stream", json!({}))));
    let good = timed(other.call(100, "good__echo", json!({"text": "meanwhile"})));
    let (silent, (good, good_took)) = tokio::join!(futures_util::future::join_all(silent), good);
    assert_eq!(text_of(&answer_of(&good, &json!(100))), "good:meanwhile");
    for (id, (reply, took)) in silent.iter().enumerate() {
        assert_eq!(reply.header("content-type"), Some("text/event-stream"));
        assert_server_error(&answer_of(reply, &json!(id)), "hostile", "sent nothing for 1000 ms");
        assert!(took >= &Duration::from_millis(900) && took < &Duration::from_secs(10), "cut after {took:?}");
        assert!(good_took < *took, "good answered after the silent streams were cut ({good_took:?})");
    }
    // A JSON answer whose body never comes: the same bound.
    let (reply, took) = timed(session.call(20, "hostile__idle_json", json!({}))).await;
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_server_error(&answer_of(&reply, &json!(20)), "hostile", "nothing arrived for 1 s");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(10), "cut after {took:?}");
    setup
        .hostile_stats_once(0, "the silent streams to close", |s| s["open_streams"] == 0 && s["closed_streams"] == 9)
        .await;
    setup.still_serves_good("/mcp", Some(&session)).await;
}

#[tokio::test]
async fn an_endless_stream_lives_while_its_client_reads_and_is_closed_upstream_when_it_leaves() {
    let setup =
        setup(&[("hostile", "normal")], &[("/mcp", "{streamIdleTimeoutMs: 1000, maxStreamsPerSession: 2}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let rss_before = setup.gateway.rss_bytes();
    let mut first = session.open_stream(1, "hostile__progress_forever", json!({})).await;
    assert_eq!(
        (first.status, first.headers.get("content-type").unwrap().to_str().unwrap()),
        (200, "text/event-stream")
    );
    // Longer than the idle timeout: a stream that keeps sending is not
    // idle, and every message is relayed as it comes.
    let started = Instant::now();
    let mut progress = Vec::new();
    while started.elapsed() < Duration::from_millis(1500) {
        let message = first.next(Duration::from_secs(2)).await.expect("the stream goes on");
        assert_eq!(message["method"], "notifications/progress", "{message}");
        progress.push(message["params"]["progress"].as_u64().unwrap());
    }
    assert!(progress.len() >= 20, "{progress:?}");
    assert!(progress.windows(2).all(|w| w[1] == w[0] + 1), "progress lost or reordered: {progress:?}");

    // With one stream open, the session still calls `good`.
    let reply = session.call(2, "good__echo", json!({"text": "beside"})).await;
    assert_eq!(text_of(&answer_of(&reply, &json!(2))), "good:beside");
    // A second endless stream takes the session's last place...
    let mut second = session.open_stream(3, "hostile__progress_forever", json!({})).await;
    assert_eq!(second.next(Duration::from_secs(2)).await.unwrap()["method"], "notifications/progress");
    // ...so a third request that would stream is refused, before it
    // reaches any server.
    let refused = session.call(4, "hostile__progress_forever", json!({})).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    let error = refused.json();
    assert_eq!((error["id"].clone(), error["error"]["code"].clone()), (json!(4), json!(-32600)), "{error}");
    assert!(error["error"]["message"].as_str().unwrap().contains("this session has 2 streams open"), "{error}");
    assert_eq!(setup.hostile[0].stats().await["calls"]["progress_forever"], 2);
    assert_eq!(setup.hostile[0].stats().await["open_streams"], 2);
    // Other sessions are not bounded by this one's streams.
    let other = Session::open(&setup.gateway, "/mcp").await;
    let reply = other.call(5, "good__echo", json!({"text": "other"})).await;
    assert_eq!(text_of(&answer_of(&reply, &json!(5))), "good:other");

    // The client leaves: the gateway closes both upstream streams, and the
    // session has its places back.
    drop(first);
    drop(second);
    setup
        .hostile_stats_once(0, "the endless streams to close", |s| s["open_streams"] == 0 && s["closed_streams"] == 2)
        .await;
    setup.assert_rss_within_bound(rss_before);
    setup.still_serves_good("/mcp", Some(&session)).await;
    let mut again = session.open_stream(6, "hostile__progress_forever", json!({})).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.next(Duration::from_secs(2)).await.unwrap()["method"], "notifications/progress");
}

#[tokio::test]
async fn a_firehose_to_a_client_that_does_not_read_is_held_back() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "{maxMessageBytes: 65536}")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let rss_before = setup.gateway.rss_bytes();
    // 32 KiB events as fast as the socket takes them; the client reads
    // the head and then nothing.
    let stream = session.open_stream(1, "hostile__flood", json!({})).await;
    assert_eq!(stream.status, 200);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let early = setup.hostile[0].stats().await["flood_bytes"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let late = setup.hostile[0].stats().await["flood_bytes"].as_u64().unwrap();
    assert!(early > MIB, "the server did not flood ({early} bytes)");
    // Only socket and connection buffers fill, then the server is held.
    assert!(late < 64 * MIB, "the gateway took {} MiB from a server its client does not read", late / MIB);
    assert!(late - early < 8 * MIB, "the server still sends: {} MiB then {} MiB", early / MIB, late / MIB);
    setup.assert_rss_within_bound(rss_before);
    setup.still_serves_good("/mcp", Some(&session)).await;
    drop(stream);
    setup.hostile_stats_once(0, "the flood to stop", |s| s["open_streams"] == 0 && s["closed_streams"] == 1).await;
}

#[tokio::test]
async fn malformed_answers_become_json_rpc_errors_naming_the_server() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    // The hostile server answers properly too: what follows is its doing.
    assert_eq!(text_of(&answer_of(&session.call(1, "hostile__ok", json!({})).await, &json!(1))), "hostile ok");

    for (id, tool) in [(2, "not_json"), (3, "not_utf8"), (4, "json_array")] {
        let reply = session.call(id, &format!("hostile__{tool}"), json!({})).await;
        assert_server_error(
            &answer_of(&reply, &json!(id)),
            "hostile",
            "its answer is not a JSON-RPC response to the request",
        );
    }
    // Events that are not JSON-RPC are dropped, never relayed (`messages`
    // panics on an event that is not JSON); the request still gets its
    // answer or an error.
    let reply = session.call(5, "hostile__sse_garbage", json!({})).await;
    assert_eq!(messages(&reply).len(), 1, "{}", reply.text());
    assert_server_error(&answer_of(&reply, &json!(5)), "hostile", "its stream ended without the answer");
    let reply = session.call(6, "hostile__sse_garbage_then_answer", json!({})).await;
    assert_eq!(messages(&reply).len(), 1, "{}", reply.text());
    assert_eq!(text_of(&answer_of(&reply, &json!(6))), "after the garbage");
    // An answer to an id the client never sent does not end its request.
    let reply = session.call(7, "hostile__sse_wrong_id", json!({"id": "not-your-id"})).await;
    assert_server_error(&answer_of(&reply, &json!(7)), "hostile", "its stream ended without the answer");
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// A JSON body that parses but is not the answer to the request (no
/// JSON-RPC at all, or the answer to another id) is as bad as one that
/// does not parse: the client waits on its id for ever otherwise.
#[tokio::test]
async fn a_json_answer_that_is_not_the_answer_to_the_request_is_an_error() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    for (id, tool) in [(1, "not_jsonrpc"), (2, "wrong_id")] {
        let reply = session.call(id, &format!("hostile__{tool}"), json!({})).await;
        let answer = reply.json();
        assert_eq!(answer["id"], id, "{tool}: the client got an answer to no request of its own: {answer}");
        assert_server_error(&answer, "hostile", "");
    }
    setup.still_serves_good("/mcp", Some(&session)).await;
}

#[tokio::test]
async fn a_server_that_never_sends_its_head_is_cut_at_its_timeout() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let slow = timed(session.call(1, "hostile__slow_head", json!({})));
    let good = timed(session.call(2, "good__echo", json!({"text": "first"})));
    let ((slow, slow_took), (good, good_took)) = tokio::join!(slow, good);
    assert_eq!(text_of(&answer_of(&good, &json!(2))), "good:first");
    assert!(good_took < slow_took, "good waited on the silent server: {good_took:?}");
    assert_server_error(&answer_of(&slow, &json!(1)), "hostile", "did not answer within 1000 ms");
    assert!(slow_took >= Duration::from_millis(900) && slow_took < Duration::from_secs(10), "cut after {slow_took:?}");
    setup.hostile_stats_once(0, "the request to be dropped", |s| s["closed_streams"] == 1).await;
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// A listing answered as an SSE stream of keep-alive comments, for ever:
/// each comment is a frame within the server's timeout, so only a bound on
/// the whole exchange ends it.
#[tokio::test]
async fn a_listing_trickled_for_ever_does_not_hold_the_route() {
    let setup = setup(&[("trickle", "trickle")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let listed = tokio::time::timeout(Duration::from_secs(15), session.request(1, "tools/list", json!({}))).await;
    let reply = listed.expect("tools/list held past 15 s by a server trickling comments (timeoutMs: 1000)");
    let tools = tool_names(&answer_of(&reply, &json!(1)));
    assert!(tools.contains(&"good__echo".to_string()), "{tools:?}");
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// Items of a listing that are not tools (no object, no string name) are
/// not passed on: one would fail the client's parse of the whole merged
/// listing, `good`'s tools with it.
#[tokio::test]
async fn a_listing_of_things_that_are_not_tools_does_not_poison_the_merged_one() {
    let setup = setup(&[("poison", "poison")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    let answer = answer_of(&session.request(1, "tools/list", json!({})).await, &json!(1));
    let tools = answer["result"]["tools"].as_array().unwrap();
    for tool in tools {
        assert!(tool["name"].is_string() && tool["inputSchema"].is_object(), "not a tool, listed: {tool}");
    }
    let names = tool_names(&answer);
    assert!(names.contains(&"good__echo".to_string()) && names.contains(&"poison__real".to_string()), "{names:?}");
    setup.still_serves_good("/mcp", Some(&session)).await;
}

/// The same trickle in answer to `initialize`: a new session waits on
/// every server's `initialize`, so without a bound on the exchange no
/// client opens a session on the route, `good` or not.
#[tokio::test]
async fn an_initialize_trickled_for_ever_does_not_hold_new_sessions() {
    let setup = setup_with(&[("trickle", &["--initialize", "trickle"])], &[("/mcp", "")]).await;
    let opened = tokio::time::timeout(Duration::from_secs(15), Session::open(&setup.gateway, "/mcp")).await;
    let session = opened.expect("initialize held past 15 s by a server trickling comments (timeoutMs: 1000)");
    let reply = session.call(1, "good__echo", json!({"text": "in"})).await;
    assert_eq!(text_of(&answer_of(&reply, &json!(1))), "good:in");
}

/// A server answers only the request sent to it: an answer on its stream
/// to another id of the client's (here 5, a call to `good` in flight) is
/// not relayed, or the client takes it for `good`'s answer.
#[tokio::test]
async fn a_server_cannot_answer_the_clients_requests_to_another_server() {
    let setup = setup(&[("hostile", "normal")], &[("/mcp", "")]).await;
    let session = Session::open(&setup.gateway, "/mcp").await;
    for tool in ["hostile__sse_wrong_id", "hostile__wrong_id"] {
        let reply = session.call(7, tool, json!({"id": 5})).await;
        let forged: Vec<Value> = messages(&reply).into_iter().filter(|m| m["id"] == 5).collect();
        assert!(forged.is_empty(), "{tool}: the client got an answer to its request 5 from `hostile`: {forged:?}");
        assert_server_error(&answer_of(&reply, &json!(7)), "hostile", "");
    }
    setup.still_serves_good("/mcp", Some(&session)).await;
}
