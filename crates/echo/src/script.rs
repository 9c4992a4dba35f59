//! Scripted misbehaviour, per echo instance: what the next requests to its
//! model endpoints get instead of an echo, and how many arrived.
//!
//! A gateway's retry and fallback tests put several echoes behind one route,
//! each scripted differently, and count what reached each.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::{HeaderValue, StatusCode};
use parking_lot::{Mutex, MutexGuard};
use serde::Deserialize;
use serde_json::{Value, json};

/// What one request gets instead of a normal echo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// An error reply with this status, in the endpoint's error shape
    /// (OpenAI's, or Anthropic's on `/v1/messages`), with `retry-after` if
    /// given. `code: Some("context_length_exceeded")` gives the provider's
    /// own context-length message.
    Status { status: u16, retry_after: Option<String>, code: Option<String> },
    /// Read the request, then send nothing until the client closes the
    /// connection (or the echo stops).
    Hang,
    /// Send the head and `n` content chunks of the reply (streamed or not),
    /// then abort the connection: the client sees an error, not an end.
    ResetAfterChunks(usize),
    /// Wait this long before the head, then answer normally.
    Delay(Duration),
    /// Read the request, then drop the connection without a response.
    /// (Over HTTP/2, where the echo cannot drop a stream before its head,
    /// the stream is reset right after an empty `200` head.)
    Close,
}

impl Step {
    /// An error reply with `status` and no `retry-after`.
    pub fn status(status: u16) -> Step {
        Step::Status { status, retry_after: None, code: None }
    }

    /// 429 with `retry-after: <retry_after>`.
    pub fn rate_limited(retry_after: &str) -> Step {
        Step::Status { status: 429, retry_after: Some(retry_after.to_owned()), code: None }
    }

    /// 529, Anthropic's "overloaded".
    pub fn overloaded() -> Step {
        Step::status(529)
    }

    /// 400 with the provider's context-length error.
    pub fn context_length_exceeded() -> Step {
        Step::Status { status: 400, retry_after: None, code: Some(CONTEXT_LENGTH_EXCEEDED.to_owned()) }
    }

    /// Why the echo could not carry the step out, if it could not.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Step::Status { status, retry_after, .. } = self else {
            return Ok(());
        };
        match StatusCode::from_u16(*status) {
            Ok(code) if code.as_u16() >= 300 => {}
            _ => return Err(format!("status {status} is not a final, non-2xx status")),
        }
        match retry_after.as_deref().map(HeaderValue::from_str) {
            Some(Err(_)) => Err(format!("retry-after {retry_after:?} is not a header value")),
            _ => Ok(()),
        }
    }
}

pub(crate) const CONTEXT_LENGTH_EXCEEDED: &str = "context_length_exceeded";

/// A shared handle on one echo's script and counters: clones share them.
/// Put it in [`EchoOptions::script`](crate::EchoOptions::script) and keep a
/// clone to steer and observe the echo.
///
/// Steps apply to the model endpoints (chat completions, completions,
/// embeddings, messages, responses), one per request, after its body was
/// read: first the [`push`](Script::push)ed steps in order, then the
/// [`always`](Script::always) step if there is one, else a normal echo.
#[derive(Clone, Default)]
pub struct Script(Arc<Shared>);

#[derive(Default)]
struct Shared {
    plan: Mutex<Plan>,
    requests: AtomicU64,
    completed: AtomicU64,
}

#[derive(Default)]
struct Plan {
    /// Steps with how many more requests each applies to.
    queue: VecDeque<(Step, u64)>,
    always: Option<Step>,
}

impl Script {
    pub fn new() -> Script {
        Script::default()
    }

    /// Queues `step` for the next `times` requests, after the steps queued
    /// before it.
    ///
    /// # Panics
    /// If the echo could not carry `step` out (a 2xx status, say): a test
    /// that scripts nonsense fails where it does.
    pub fn push(&self, step: Step, times: u64) {
        if let Err(problem) = step.check() {
            panic!("{step:?}: {problem}");
        }
        if times > 0 {
            self.plan().queue.push_back((step, times));
        }
    }

    /// Applies `step` to every request once the queue is empty, until
    /// called again with `None`.
    ///
    /// # Panics
    /// As [`push`](Script::push).
    pub fn always(&self, step: Option<Step>) {
        if let Some(Err(problem)) = step.as_ref().map(Step::check) {
            panic!("{step:?}: {problem}");
        }
        self.plan().always = step;
    }

    /// Forgets every queued step and the `always` step.
    pub fn clear(&self) {
        *self.plan() = Plan::default();
    }

    /// Requests that reached a model endpoint, failed ones included.
    pub fn requests(&self) -> u64 {
        self.0.requests.load(Ordering::SeqCst)
    }

    /// Requests answered with a whole, successful reply (a stream counts
    /// once its last event is out).
    pub fn completed(&self) -> u64 {
        self.0.completed.load(Ordering::SeqCst)
    }

    /// Requests the queued steps still apply to.
    pub fn queued(&self) -> u64 {
        self.plan().queue.iter().map(|(_, times)| times).fold(0, |sum, times| sum.saturating_add(*times))
    }

    pub(crate) fn arrived(&self) {
        self.0.requests.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn complete(&self) {
        self.0.completed.fetch_add(1, Ordering::SeqCst);
    }

    /// The step for the request at hand, if any.
    pub(crate) fn next_step(&self) -> Option<Step> {
        let mut plan = self.plan();
        let Some((step, times)) = plan.queue.front_mut() else {
            return plan.always.clone();
        };
        *times = times.saturating_sub(1);
        let step = step.clone();
        if *times == 0 {
            plan.queue.pop_front();
        }
        Some(step)
    }

    pub(crate) fn stats(&self) -> Value {
        let always = self.plan().always.is_some();
        json!({
            "requests": self.requests(),
            "completed": self.completed(),
            "queued": self.queued(),
            "always": always,
        })
    }

    /// Applies a `POST /_echo/script` body (see the crate docs), returning
    /// why not if it is malformed; a malformed body changes nothing.
    pub(crate) fn apply_json(&self, body: &[u8]) -> Result<(), String> {
        let spec: ScriptSpec = serde_json::from_slice(body).map_err(|err| format!("script: {err}"))?;
        if spec.push.len() > MAX_PUSHED {
            return Err(format!("script: at most {MAX_PUSHED} steps at once"));
        }
        let always = spec.always.map(Step::from);
        let pushed: Vec<(Step, u64)> =
            spec.push.into_iter().map(|entry| (Step::from(entry.step), entry.times.unwrap_or(1))).collect();
        for step in always.iter().chain(pushed.iter().map(|(step, _)| step)) {
            step.check().map_err(|problem| format!("script: {step:?}: {problem}"))?;
        }
        let mut plan = self.plan();
        if spec.clear {
            *plan = Plan::default();
        }
        if always.is_some() {
            plan.always = always;
        }
        plan.queue.extend(pushed.into_iter().filter(|(_, times)| *times > 0));
        Ok(())
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.0.plan.lock()
    }
}

impl std::fmt::Debug for Script {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Script")
            .field("requests", &self.requests())
            .field("completed", &self.completed())
            .field("queued", &self.queued())
            .finish()
    }
}

/// Steps one `POST /_echo/script` may queue.
const MAX_PUSHED: usize = 1024;

/// `{"clear": true, "always": {"step": "close"}, "push": [{"step": "status",
/// "status": 429, "retry_after": "1", "times": 2}]}`: clears first, then sets
/// `always` (if given), then queues `push`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptSpec {
    #[serde(default)]
    clear: bool,
    #[serde(default)]
    always: Option<StepSpec>,
    #[serde(default)]
    push: Vec<Pushed>,
}

#[derive(Deserialize)]
struct Pushed {
    #[serde(flatten)]
    step: StepSpec,
    times: Option<u64>,
}

#[derive(Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
enum StepSpec {
    Status {
        status: u16,
        #[serde(default)]
        retry_after: Option<String>,
        #[serde(default)]
        code: Option<String>,
    },
    Hang,
    ResetAfterChunks {
        chunks: usize,
    },
    Delay {
        ms: u64,
    },
    Close,
}

impl From<StepSpec> for Step {
    fn from(spec: StepSpec) -> Step {
        match spec {
            StepSpec::Status { status, retry_after, code } => Step::Status { status, retry_after, code },
            StepSpec::Hang => Step::Hang,
            StepSpec::ResetAfterChunks { chunks } => Step::ResetAfterChunks(chunks),
            StepSpec::Delay { ms } => Step::Delay(Duration::from_millis(ms)),
            StepSpec::Close => Step::Close,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_steps_come_first_then_always_then_nothing() {
        let script = Script::new();
        let handle = script.clone();
        handle.push(Step::status(503), 2);
        handle.push(Step::Close, 1);
        assert_eq!(script.queued(), 3);
        assert_eq!(script.next_step(), Some(Step::status(503)));
        script.always(Some(Step::Hang));
        assert_eq!(script.next_step(), Some(Step::status(503)));
        assert_eq!(script.next_step(), Some(Step::Close));
        assert_eq!(script.next_step(), Some(Step::Hang));
        assert_eq!(script.next_step(), Some(Step::Hang));
        handle.always(None);
        assert_eq!(script.next_step(), None);
        assert_eq!(script.queued(), 0);
    }

    #[test]
    fn json_scripts_apply_whole_or_not_at_all() {
        let script = Script::new();
        let body = json!({
            "always": {"step": "delay", "ms": 5},
            "push": [
                {"step": "status", "status": 429, "retry_after": "1", "times": 2},
                {"step": "reset_after_chunks", "chunks": 3},
                {"step": "hang", "times": 0},
            ],
        });
        script.apply_json(body.to_string().as_bytes()).unwrap();
        assert_eq!(script.next_step(), Some(Step::rate_limited("1")));
        assert_eq!(script.next_step(), Some(Step::rate_limited("1")));
        assert_eq!(script.next_step(), Some(Step::ResetAfterChunks(3)));
        assert_eq!(script.next_step(), Some(Step::Delay(Duration::from_millis(5))));

        let bad = json!({"clear": true, "push": [{"step": "close"}, {"step": "status", "status": 200}]});
        let err = script.apply_json(bad.to_string().as_bytes()).unwrap_err();
        assert!(err.contains("200"), "{err}");
        assert!(script.apply_json(br#"{"push": [{"step": "explode"}]}"#).is_err());
        assert!(script.apply_json(br#"{"clear": true, "extra": 1}"#).is_err());
        // Nothing of the rejected scripts applied.
        assert_eq!(script.next_step(), Some(Step::Delay(Duration::from_millis(5))));

        script.apply_json(br#"{"clear": true}"#).unwrap();
        assert_eq!(script.next_step(), None);
    }

    #[test]
    #[should_panic(expected = "not a header value")]
    fn nonsense_steps_fail_where_they_are_scripted() {
        Script::new().push(Step::rate_limited("1\n"), 1);
    }
}
