//! Test builds only (feature `mutants`, binary `receiver-mutant`): the receiver with one rule
//! broken, chosen by `RECEIVER_MUTANT` (`result_inbox::mutants`), so that the conformance kit
//! can prove each of its cases can fail. Built by `make mutant-build`, never released.

use std::sync::OnceLock;

pub use result_inbox::mutants::Mutant;

/// The mutant `RECEIVER_MUTANT` names; unset means none. A bad value is fatal: a kit run
/// against a misspelt mutant would prove nothing.
pub fn active() -> Option<Mutant> {
    static ACTIVE: OnceLock<Option<Mutant>> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        #[allow(clippy::disallowed_methods)] // a test build's own switch, not configuration
        let name = std::env::var("RECEIVER_MUTANT").unwrap_or_default();
        if name.is_empty() {
            return None;
        }
        match Mutant::parse(&name) {
            Some(m) => {
                eprintln!("receiver-mutant: breaking one rule on purpose: {m}");
                Some(m)
            }
            None => {
                let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
                eprintln!(
                    "receiver-mutant: RECEIVER_MUTANT={name:?} is not one of {}",
                    names.join(", ")
                );
                std::process::exit(2);
            }
        }
    })
}

/// Whether `m` is the active mutant.
pub fn is(m: Mutant) -> bool {
    active() == Some(m)
}

/// At the start of `consume`: [`Mutant::PrintsToken`] prints the platform token.
pub fn at_start(token: &str) {
    if is(Mutant::PrintsToken) {
        eprintln!("receiver-mutant: platform token {token}");
    }
}

/// What `consume` does once its consumer has stopped: [`Mutant::PauseOnSigterm`] pauses the
/// subscription.
pub async fn on_stop(client: orbit_sdk::Client, subscription: String) {
    if is(Mutant::PauseOnSigterm) {
        match client.pause_subscription(&subscription).await {
            Ok(_) => eprintln!("receiver-mutant: paused subscription {subscription}"),
            Err(e) => {
                eprintln!("receiver-mutant: could not pause subscription {subscription}: {e}")
            }
        }
    }
}

/// The event [`Mutant::FloatNumbers`] applies instead of `raw`: every number of its result
/// through an `f64` (`None` for the other mutants, or when `raw` is not a JSON object).
pub fn rewrite_event(raw: &str) -> Option<String> {
    if !is(Mutant::FloatNumbers) {
        return None;
    }
    let mut event: serde_json::Value = serde_json::from_str(raw).ok()?;
    let result = event.get_mut("result")?;
    *result = through_f64(result.take());
    Some(event.to_string())
}

fn through_f64(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Number(n), Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(through_f64).collect()),
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k, through_f64(v)))
                .collect(),
        ),
        other => other,
    }
}
