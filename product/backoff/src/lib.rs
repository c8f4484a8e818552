//! The pacing of every retry in this workspace: a wait that doubles from a first step up to a
//! cap, each wait jittered so that many retriers do not move in step. The store's restarts
//! inside one apply, `consume` waiting for its database at start, the outage probe, and the
//! SDK's reconnects all take their waits from a [`Backoff`].
//!
//! What this crate must never do: sleep (callers own their clocks, real or paused) or decide
//! whether to retry at all.

use std::time::Duration;

/// Doubling waits with jitter. Each [`Backoff::next_wait`] is the current step scaled by a
/// random factor from the jitter range; then the step doubles, up to the cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    step: Duration,
    /// The jitter factor is drawn from `low..low + spread`.
    low: f64,
    spread: f64,
    rng: fastrand::Rng,
}

impl Backoff {
    /// Waits from `first` doubling up to `max`, each jittered to between half and all of the
    /// step.
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max,
            step: first,
            low: 0.5,
            spread: 0.5,
            rng: fastrand::Rng::new(),
        }
    }

    /// The same waits, each jittered to a factor from `low` up to `high` of the step instead.
    pub fn jitter(mut self, low: f64, high: f64) -> Backoff {
        self.low = low;
        self.spread = (high - low).max(0.0);
        self
    }

    /// The same waits from a seeded generator, so that a test can repeat them.
    pub fn seeded(mut self, seed: u64) -> Backoff {
        self.rng = fastrand::Rng::with_seed(seed);
        self
    }

    /// The next wait; the step doubles for the one after (up to the cap).
    pub fn next_wait(&mut self) -> Duration {
        let wait = self.step.mul_f64(self.low + self.rng.f64() * self.spread);
        self.step = (self.step * 2).min(self.max);
        wait
    }

    /// Starts again from the first step (after a success).
    pub fn reset(&mut self) {
        self.step = self.first;
    }

    /// The longest step: what a caller tells people about how often it tries.
    pub fn max(&self) -> Duration {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_cap_each_within_its_jitter() {
        let mut b = Backoff::new(10 * MS, 400 * MS).seeded(7);
        let steps = [10, 20, 40, 80, 160, 320, 400, 400];
        for step in steps {
            let wait = b.next_wait();
            let step = step * MS;
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} for a step of {step:?}"
            );
        }
        b.reset();
        assert!(b.next_wait() <= 10 * MS);
    }

    #[test]
    fn a_wider_jitter_can_wait_longer_than_the_step() {
        let mut b = Backoff::new(100 * MS, 100 * MS).jitter(0.5, 1.5).seeded(1);
        let waits: Vec<Duration> = (0..200).map(|_| b.next_wait()).collect();
        assert!(waits.iter().all(|w| *w >= 50 * MS && *w < 150 * MS));
        assert!(
            waits.iter().any(|w| *w > 100 * MS),
            "some wait exceeds the step"
        );
    }
}
