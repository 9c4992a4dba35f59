//! How a route spreads requests over its backends and survives their
//! failures: weights and priorities, retries and their budget, passive
//! health (outlier ejection), model fallbacks, per-backend timeouts and TLS.

use std::path::PathBuf;
use std::time::Duration;

use crate::Secret;

/// The API a backend speaks. Clients and plugins always see OpenAI's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI-compatible: requests pass through as they are.
    #[default]
    OpenAi,
    /// Anthropic's Messages API: chat requests and responses are translated.
    Anthropic,
}

impl Provider {
    /// The name the CRDs, the admin view and `gen_ai.provider.name` use.
    pub fn name(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

/// Why an attempt failed, as retry and fallback policies name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Condition {
    /// The connection could not be made: nothing reached the backend.
    ConnectFailure,
    /// The connection broke after the request was sent, before a response
    /// head: the backend may have acted on it.
    Reset,
    /// No response head within the first-byte (or per-try) timeout: the
    /// backend may have acted on it.
    Timeout,
    /// 429.
    RateLimited,
    /// 503 and 529: the backend says it did not take the work on.
    Overloaded,
    /// Any other 5xx.
    ServerError,
    /// The backend refused the prompt as too long for the model (OpenAI's
    /// `context_length_exceeded`), or a plugin did.
    ContextLengthExceeded,
}

impl Condition {
    pub const ALL: [Condition; 7] = [
        Condition::ConnectFailure,
        Condition::Reset,
        Condition::Timeout,
        Condition::RateLimited,
        Condition::Overloaded,
        Condition::ServerError,
        Condition::ContextLengthExceeded,
    ];

    /// The name the CRDs, metrics and logs use.
    pub fn name(self) -> &'static str {
        match self {
            Condition::ConnectFailure => "ConnectFailure",
            Condition::Reset => "Reset",
            Condition::Timeout => "Timeout",
            Condition::RateLimited => "RateLimited",
            Condition::Overloaded => "Overloaded",
            Condition::ServerError => "ServerError",
            Condition::ContextLengthExceeded => "ContextLengthExceeded",
        }
    }

    pub fn from_name(name: &str) -> Option<Condition> {
        Condition::ALL.into_iter().find(|c| c.name() == name)
    }

    /// The condition a response status is, if it is a failure a policy can
    /// name (`context_length_exceeded` needs the body: see
    /// [`Condition::ContextLengthExceeded`]).
    pub fn of_status(status: u16) -> Option<Condition> {
        match status {
            429 => Some(Condition::RateLimited),
            503 | 529 => Some(Condition::Overloaded),
            500..=599 => Some(Condition::ServerError),
            _ => None,
        }
    }

    /// Whether a backend failing this way counts against its health: a
    /// refused prompt says nothing about the backend.
    pub fn is_backend_failure(self) -> bool {
        !matches!(self, Condition::ContextLengthExceeded)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of [`Condition`]s.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Conditions(u8);

impl Conditions {
    pub const fn empty() -> Self {
        Self(0)
    }

    pub fn contains(self, condition: Condition) -> bool {
        self.0 & condition.bit() != 0
    }

    pub fn iter(self) -> impl Iterator<Item = Condition> {
        Condition::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

impl FromIterator<Condition> for Conditions {
    fn from_iter<I: IntoIterator<Item = Condition>>(iter: I) -> Self {
        Self(iter.into_iter().fold(0, |bits, c| bits | c.bit()))
    }
}

impl std::fmt::Debug for Conditions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(Condition::name)).finish()
    }
}

/// When and how a failed attempt is tried again, on the next backend in
/// order (or the same one, if it is the only one left).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included. `None`: one per backend.
    pub attempts: Option<u32>,
    pub on: Conditions,
    /// Deadline for each attempt's response head, instead of the
    /// backend's first-byte timeout, when shorter.
    pub per_try_timeout: Option<Duration>,
    /// Exponential backoff with full jitter between attempts: a random
    /// wait up to `base × 2^retry`, at most `max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// A `retry-after` up to this long is waited for before trying the same
    /// backend again; a longer one skips the backend for that long.
    pub max_retry_after: Duration,
    /// Retries in flight on the route may be at most this percentage of its
    /// requests in flight (or `budget_min_concurrency`, if more): retries
    /// cannot multiply an outage's load.
    pub budget_percent: u32,
    pub budget_min_concurrency: u32,
}

impl Default for RetryPolicy {
    /// What a route without a retry policy does: the next backend when one
    /// cannot be connected to, as before policies existed.
    fn default() -> Self {
        Self {
            attempts: None,
            on: [Condition::ConnectFailure].into_iter().collect(),
            per_try_timeout: None,
            backoff_base: Duration::from_millis(25),
            backoff_max: Duration::from_millis(250),
            max_retry_after: Duration::from_secs(10),
            budget_percent: 20,
            budget_min_concurrency: 3,
        }
    }
}

impl RetryPolicy {
    /// Conditions a policy that names none retries: those where the backend
    /// did not do the work.
    pub fn default_conditions() -> Conditions {
        [Condition::ConnectFailure, Condition::RateLimited, Condition::Overloaded].into_iter().collect()
    }

    pub const MAX_ATTEMPTS: u32 = 10;
}

/// Passive health: a backend that fails `consecutive_failures` times in a
/// row is ejected for `base_ejection × times ejected` (at most
/// `max_ejection`), then takes traffic again. A success resets the count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutlierPolicy {
    /// 0 turns ejection off.
    pub consecutive_failures: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
}

impl Default for OutlierPolicy {
    fn default() -> Self {
        Self { consecutive_failures: 5, base_ejection: Duration::from_secs(10), max_ejection: Duration::from_secs(300) }
    }
}

/// Another model to serve the request when this route's backends fail in
/// one of the named ways: the request is routed again as if it had asked for
/// `model` (that route's plugins and backends), in the same namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fallback {
    pub model: String,
    pub on: Conditions,
}

impl Fallback {
    /// Fallbacks followed for one request, the first route's included
    /// hops: a cycle of fallbacks ends.
    pub const MAX_HOPS: usize = 3;
}

/// A backend's deadlines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendTimeouts {
    /// Connecting (TCP and TLS).
    pub connect: Option<Duration>,
    /// From sending the request to the response head; the route's
    /// `timeoutMs` when unset.
    pub first_byte: Option<Duration>,
    /// Between two chunks of the response body.
    pub idle: Option<Duration>,
    /// The whole exchange, the response body included.
    pub total: Option<Duration>,
}

impl BackendTimeouts {
    pub const DEFAULT_CONNECT: Duration = Duration::from_secs(10);
}

/// PEM data: a file of the gateway's, or a Secret's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pem {
    File(PathBuf),
    Value(Secret),
}

impl Pem {
    /// The largest PEM file read.
    pub const MAX_FILE_BYTES: u64 = 1 << 20;

    /// Its bytes: the Secret's value, or the file's, refused past
    /// [`Pem::MAX_FILE_BYTES`]. `what` names it in errors (`tls CA bundle`).
    pub fn read(&self, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Pem::Value(secret) => Ok(secret.expose().as_bytes().to_vec()),
            Pem::File(path) => {
                use std::io::Read;
                let read = |e: std::io::Error| format!("reading the {what} {}: {e}", path.display());
                let mut bytes = Vec::new();
                std::fs::File::open(path)
                    .map_err(read)?
                    .take(Self::MAX_FILE_BYTES + 1)
                    .read_to_end(&mut bytes)
                    .map_err(read)?;
                if bytes.len() as u64 > Self::MAX_FILE_BYTES {
                    return Err(format!("the {what} {} is larger than {} bytes", path.display(), Self::MAX_FILE_BYTES));
                }
                Ok(bytes)
            }
        }
    }
}

/// How the gateway verifies a backend and identifies itself to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendTls {
    /// CA certificates trusted for this backend instead of the public roots
    /// (a self-hosted server behind a company CA).
    pub ca: Option<Pem>,
    /// A client certificate chain and its key, for mutual TLS.
    pub client_cert: Option<Pem>,
    pub client_key: Option<Pem>,
    /// The name to send in SNI and verify the certificate against, instead
    /// of the URL's host.
    pub server_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_conditions() {
        assert_eq!(Condition::of_status(429), Some(Condition::RateLimited));
        assert_eq!(Condition::of_status(529), Some(Condition::Overloaded));
        assert_eq!(Condition::of_status(503), Some(Condition::Overloaded));
        assert_eq!(Condition::of_status(502), Some(Condition::ServerError));
        assert_eq!(Condition::of_status(400), None);
        assert_eq!(Condition::of_status(200), None);
    }

    #[test]
    fn condition_sets_hold_what_was_put_in() {
        let set: Conditions = [Condition::Timeout, Condition::ContextLengthExceeded].into_iter().collect();
        assert!(set.contains(Condition::Timeout) && set.contains(Condition::ContextLengthExceeded));
        assert!(!set.contains(Condition::Reset));
        assert_eq!(set.iter().collect::<Vec<_>>(), vec![Condition::Timeout, Condition::ContextLengthExceeded]);
        for condition in Condition::ALL {
            assert_eq!(Condition::from_name(condition.name()), Some(condition));
        }
    }
}
