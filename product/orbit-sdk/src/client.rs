//! The HTTP client: one method per call of the contract, typed errors, and the URL policy
//! (plain `http`/`ws` to loopback only; `https`/`wss` everywhere else).

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;

use endpoint::tls::TlsProblem;

use crate::trust::{Trust, TrustError};
use orbit_wire::Token;
use orbit_wire::{
    AckedPage, AddBudget, CreateSubscription, CredentialInfo, DeliveryInfo, ErrorBody, Redeliver,
    ReportTask, SubmitTask, Subscription, Task,
};
use orbit_wire::{DeliveryId, SubscriptionId};

/// Why a call failed. Never contains a token or a proof.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SdkError {
    /// The platform answered with an error.
    #[error("the platform answered {status} {code}: {message}")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    /// The URL breaks the policy or does not parse.
    #[error("invalid ORBIT_URL: {0}")]
    Url(String),
    /// The platform could not be reached, or the connection broke.
    #[error("cannot reach the platform at {0}; check ORBIT_URL")]
    Transport(#[source] TransportError),
    /// The platform answered something that is not the contract.
    #[error("unexpected reply from the platform: {0}")]
    Decode(String),
    /// The TLS handshake with the platform failed.
    #[error("ORBIT_URL {url}: TLS: {}: {}", .problem.describe(), tls_advice(*.problem))]
    Tls { url: String, problem: TlsProblem },
    /// The CAs to trust could not be loaded.
    #[error("ORBIT_CA_FILE {0}")]
    Trust(#[from] TrustError),
}

/// What to check, for each TLS problem with the platform.
fn tls_advice(problem: TlsProblem) -> &'static str {
    match problem {
        TlsProblem::UntrustedCertificate => {
            "name the platform's CA in ORBIT_CA_FILE (a PEM file), or add it to the system's trust store"
        }
        TlsProblem::NameMismatch => "use a host name or address the certificate carries",
        TlsProblem::Expired => "the platform needs a new certificate",
        TlsProblem::ClientCertificateRefused => "the platform wants a client certificate, which the SDK does not send",
        TlsProblem::NoTls | TlsProblem::Required | TlsProblem::Handshake => {
            "check that ORBIT_URL is the platform's https address"
        }
    }
}

/// A failure below the protocol (DNS, TCP, HTTP framing, a timeout) on the way to the
/// platform at `host:port`. `Display` says it in plain words ("127.0.0.1:8080: connection
/// refused: nothing listens on that port"), never as the clients' chain of messages;
/// `source()` gives the underlying error.
#[derive(Debug)]
pub struct TransportError {
    at: String,
    error: reqwest::Error,
}

impl TransportError {
    fn new(at: &str, e: reqwest::Error) -> TransportError {
        TransportError {
            at: at.to_owned(),
            error: e.without_url(),
        }
    }

    /// Whether it was a timeout (the platform did not answer in time).
    pub fn is_timeout(&self) -> bool {
        self.error.is_timeout()
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match endpoint::reach::Unreachable::find(&self.error) {
            Some(cause) => cause.describe(),
            None if self.error.is_timeout() => "timed out: the platform did not answer in time",
            None if self.error.is_connect() => "the connection could not be made",
            None if self.error.is_body() || self.error.is_decode() => {
                "the platform's reply broke off"
            }
            None => "the request could not be sent",
        };
        write!(f, "{}: {what}", self.at)
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl SdkError {
    /// The API error code, if the platform answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            SdkError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, if the platform answered with an error.
    pub fn status(&self) -> Option<u16> {
        match self {
            SdkError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A checked base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    secure: bool,
    /// `host[:port]` and any path prefix, without a trailing slash.
    rest: String,
    /// `host:port`, the scheme's port when the URL gives none: what error lines name.
    address: String,
}

impl BaseUrl {
    /// Parses `url`, refusing plain HTTP to anything but loopback.
    pub fn parse(url: &str) -> Result<BaseUrl, SdkError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| SdkError::Url("must start with http:// or https://".into()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (authority, after) = endpoint::split_authority(rest);
        let parsed = endpoint::Authority::parse(authority);
        if matches!(parsed, Err(endpoint::AuthorityError::NoHost))
            || parsed.is_ok_and(|a| a.has_userinfo())
        {
            return Err(SdkError::Url("needs a host and no user information".into()));
        }
        // The platform's API lives at its root: a path, a query or a fragment would only show
        // up later, as 404s on every call.
        if !after.is_empty() {
            return Err(SdkError::Url(
                "must be the platform's address alone, without a path, query or fragment, e.g. http://127.0.0.1:8080"
                    .into(),
            ));
        }
        let Ok(parsed) = parsed else {
            return Err(SdkError::Url(
                "has a port that is not a number from 1 to 65535".into(),
            ));
        };
        let secure = match scheme.to_ascii_lowercase().as_str() {
            "https" => true,
            "http" if parsed.is_loopback() => false,
            "http" => {
                return Err(SdkError::Url(format!(
                    "must use https for a host that is not loopback: https://{authority}"
                )))
            }
            other => return Err(SdkError::Url(format!("unsupported scheme {other}"))),
        };
        let address = match parsed.port() {
            Some(_) => authority.to_owned(),
            None => format!("{authority}:{}", if secure { 443 } else { 80 }),
        };
        Ok(BaseUrl {
            secure,
            rest: rest.to_owned(),
            address,
        })
    }

    /// `host:port` of the platform.
    pub fn address(&self) -> &str {
        &self.address
    }

    fn http(&self, path: &str) -> String {
        format!(
            "{}://{}{path}",
            if self.secure { "https" } else { "http" },
            self.rest
        )
    }

    /// The WebSocket URL for `path` (`wss` exactly when the base is `https`).
    pub fn ws(&self, path: &str) -> String {
        format!(
            "{}://{}{path}",
            if self.secure { "wss" } else { "ws" },
            self.rest
        )
    }
}

/// Filters for listing deliveries.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub state: Option<String>,
    pub task_id: Option<String>,
    pub limit: Option<u32>,
}

/// A client for one platform and one credential.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: BaseUrl,
    token: Token,
    /// The CAs `https` and `wss` trust; `None` for a plain loopback platform.
    trust: Option<Trust>,
}

/// Percent-encodes one path segment.
fn seg(s: &str) -> String {
    endpoint::encode_component(s)
}

impl Client {
    /// A client for `base_url` (see [`BaseUrl::parse`]) using `token`; an `https` platform
    /// must have a certificate the system trusts.
    pub fn new(base_url: &str, token: Token) -> Result<Client, SdkError> {
        Self::with_trust(base_url, token, None)
    }

    /// [`Client::new`] trusting `trust` for `https` and `wss` (the system's roots plus a CA
    /// file, say); `None` loads the system's roots alone, when the URL is `https`.
    ///
    /// The token goes only where `base_url` points: over TLS, or to loopback. Redirects are
    /// not followed.
    pub fn with_trust(
        base_url: &str,
        token: Token,
        trust: Option<Trust>,
    ) -> Result<Client, SdkError> {
        let base = BaseUrl::parse(base_url)?;
        let trust = match (base.secure, trust) {
            (true, None) => Some(Trust::load(None)?),
            (_, trust) => trust,
        };
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .https_only(base.secure);
        if let Some(trust) = &trust {
            builder = builder.use_preconfigured_tls((*trust.config()).clone());
        }
        let http = builder
            .build()
            .map_err(|e| SdkError::Transport(TransportError::new(base.address(), e)))?;
        Ok(Client {
            http,
            base,
            token,
            trust,
        })
    }

    /// The CAs this client trusts, when the platform is `https`.
    pub(crate) fn trust(&self) -> Option<&Trust> {
        self.trust.as_ref()
    }

    /// A transport failure, or the TLS problem behind it.
    fn transport(&self, e: reqwest::Error) -> SdkError {
        match TlsProblem::find(&e) {
            Some(problem) => SdkError::Tls {
                url: self.base.http(""),
                problem,
            },
            None => SdkError::Transport(TransportError::new(self.base.address(), e)),
        }
    }

    /// The base URL.
    pub fn base(&self) -> &BaseUrl {
        &self.base
    }

    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
    ) -> Result<T, SdkError> {
        let mut req = self
            .http
            .request(method, self.base.http(path))
            .bearer_auth(self.token.expose());
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| self.transport(e))?;
        if (300..400).contains(&status) {
            return Err(SdkError::Api {
                status,
                code: "redirect".into(),
                message: format!(
                    "HTTP {status}: the SDK follows no redirect (the token goes only where ORBIT_URL points)"
                ),
            });
        }
        if status >= 400 {
            return Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
                Ok(b) => SdkError::Api {
                    status,
                    code: b.error.code,
                    message: b.error.message,
                },
                Err(_) => SdkError::Api {
                    status,
                    code: "http_error".into(),
                    message: format!("HTTP {status} without an error body"),
                },
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| SdkError::Decode(e.to_string()))
    }

    /// Submits a task to `queue`, with an optional JSON input.
    pub async fn submit_task(
        &self,
        queue: &str,
        input: Option<&RawValue>,
    ) -> Result<Task, SdkError> {
        let body = SubmitTask {
            input: input.map(|r| r.to_owned()),
        };
        self.call(
            reqwest::Method::POST,
            &format!("/v1/queues/{}/tasks", seg(queue)),
            Some(&body),
        )
        .await
    }

    /// A task.
    pub async fn get_task(&self, id: &str) -> Result<Task, SdkError> {
        self.call(
            reqwest::Method::GET,
            &format!("/v1/tasks/{}", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// Cancels a task that has not finished.
    pub async fn cancel_task(&self, id: &str) -> Result<Task, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/tasks/{}/cancel", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// A worker's report: RUNNING, SUCCEEDED, FAILED or NEEDS_REVIEW, with a result.
    pub async fn report_task(
        &self,
        id: &str,
        state: &str,
        result: Option<&RawValue>,
    ) -> Result<Task, SdkError> {
        let body = ReportTask {
            state: state.to_owned(),
            result: result.map(|r| r.to_owned()),
        };
        self.call(
            reqwest::Method::POST,
            &format!("/v1/tasks/{}/report", seg(id)),
            Some(&body),
        )
        .await
    }

    /// Creates a subscription to `event_types` on `queue`.
    pub async fn create_subscription(
        &self,
        queue: &str,
        event_types: &[&str],
    ) -> Result<Subscription, SdkError> {
        let body = CreateSubscription {
            queue_id: queue.to_owned(),
            event_types: event_types.iter().map(|s| (*s).to_owned()).collect(),
        };
        self.call(reqwest::Method::POST, "/v1/subscriptions", Some(&body))
            .await
    }

    /// A subscription.
    pub async fn get_subscription(&self, id: &SubscriptionId) -> Result<Subscription, SdkError> {
        self.call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{}", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// Stops new deliveries to a subscription.
    pub async fn pause_subscription(&self, id: &SubscriptionId) -> Result<Subscription, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/subscriptions/{}/pause", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// Lets deliveries flow to a paused subscription again.
    pub async fn resume_subscription(&self, id: &SubscriptionId) -> Result<Subscription, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/subscriptions/{}/resume", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// A subscription's deliveries, oldest first.
    pub async fn list_deliveries(
        &self,
        subscription: &SubscriptionId,
        filter: &DeliveryFilter,
    ) -> Result<Vec<DeliveryInfo>, SdkError> {
        let mut query = Vec::new();
        if let Some(s) = &filter.state {
            query.push(format!("state={}", seg(s)));
        }
        if let Some(t) = &filter.task_id {
            query.push(format!("task_id={}", seg(t)));
        }
        if let Some(l) = filter.limit {
            query.push(format!("limit={l}"));
        }
        let q = if query.is_empty() {
            String::new()
        } else {
            format!("?{}", query.join("&"))
        };
        self.call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{}/deliveries{q}", seg(subscription)),
            None::<&()>,
        )
        .await
    }

    /// A delivery.
    pub async fn get_delivery(&self, id: &DeliveryId) -> Result<DeliveryInfo, SdkError> {
        self.call(
            reqwest::Method::GET,
            &format!("/v1/deliveries/{}", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// Gives an EXPIRED delivery `add` (1–10) more leases; it becomes PENDING again.
    pub async fn add_budget(&self, id: &DeliveryId, add: u32) -> Result<DeliveryInfo, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/deliveries/{}/budget", seg(id)),
            Some(&AddBudget { add }),
        )
        .await
    }

    /// Discards an EXPIRED delivery that can never apply: it leaves the subscription's window
    /// as DISCARDED and is never leased again.
    pub async fn discard_delivery(&self, id: &DeliveryId) -> Result<DeliveryInfo, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/deliveries/{}/discard", seg(id)),
            None::<&()>,
        )
        .await
    }

    /// One page of the deliveries ACKED in `[since, until)` (RFC 3339; `until` now when
    /// `None`), oldest ACK first, at most `limit` (1 to 10 000); `after` is the previous page's
    /// `next`.
    pub async fn list_acked(
        &self,
        subscription: &SubscriptionId,
        since: &str,
        until: Option<&str>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<AckedPage, SdkError> {
        let mut query = format!("since={}&limit={limit}", seg(since));
        if let Some(u) = until {
            query.push_str(&format!("&until={}", seg(u)));
        }
        if let Some(a) = after {
            query.push_str(&format!("&after={}", seg(a)));
        }
        self.call(
            reqwest::Method::GET,
            &format!("/v1/subscriptions/{}/acked?{query}", seg(subscription)),
            None::<&()>,
        )
        .await
    }

    /// Sends an ACKED delivery back to PENDING with `budget` leases (1 to 10; the platform's
    /// default when `None`): it is delivered again with a new proof. `409 not_acked` unless
    /// it is ACKED.
    pub async fn redeliver(
        &self,
        id: &DeliveryId,
        budget: Option<u32>,
    ) -> Result<DeliveryInfo, SdkError> {
        self.call(
            reqwest::Method::POST,
            &format!("/v1/deliveries/{}/redeliver", seg(id)),
            Some(&Redeliver { budget }),
        )
        .await
    }

    /// What this client's credential may do.
    pub async fn credential(&self) -> Result<CredentialInfo, SdkError> {
        self.call(reqwest::Method::GET, "/v1/credential", None::<&()>)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_only_to_loopback() {
        for ok in [
            "http://127.0.0.1:8080",
            "http://localhost:8080/",
            "http://[::1]:8080",
            "https://orbit.example.com",
            "HTTPS://orbit.example.com:443/",
        ] {
            assert!(BaseUrl::parse(ok).is_ok(), "{ok}");
        }
        // The API is at the platform's root: anything after the address is refused at once.
        for (bad, problem) in [
            ("https://orbit.example.com/base", "without a path"),
            ("http://127.0.0.1:8080/v1/", "without a path"),
            ("http://127.0.0.1:8080?x=1", "without a path, query"),
            ("http://127.0.0.1:99999", "port that is not a number"),
            ("http://[::1]:0", "port that is not a number"),
        ] {
            let e = BaseUrl::parse(bad).unwrap_err().to_string();
            assert!(e.contains(problem), "{bad}: {e}");
        }
        for bad in [
            "http://orbit.example.com",
            "http://10.0.0.1:8080",
            "ws://127.0.0.1",
            "127.0.0.1:8080",
            "http://user:pw@127.0.0.1",
        ] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
        let b = BaseUrl::parse("https://orbit.example.com/").unwrap();
        assert_eq!(b.ws("/v1/x"), "wss://orbit.example.com/v1/x");
        let b = BaseUrl::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(b.ws("/v1/x"), "ws://127.0.0.1:8080/v1/x");
        assert_eq!(
            BaseUrl::parse("http://orbit.example.com").unwrap_err().to_string(),
            "invalid ORBIT_URL: must use https for a host that is not loopback: https://orbit.example.com"
        );
    }
}
