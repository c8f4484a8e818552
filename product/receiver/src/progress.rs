//! Progress of a long operator command (`prune`, `reconcile`) on standard error: redrawn in
//! place on a terminal every second, a line every 10 s elsewhere (a timer's journal).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

const TERMINAL_EVERY: Duration = Duration::from_secs(1);
const LOG_EVERY: Duration = Duration::from_secs(10);

/// One command's progress line.
#[derive(Debug)]
pub struct Progress {
    /// What each line starts with (`prune`, `reconcile`).
    command: &'static str,
    terminal: bool,
    every: Duration,
    last: Instant,
    drawn: bool,
}

impl Progress {
    pub fn new(command: &'static str) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        Progress {
            command,
            terminal,
            every: if terminal { TERMINAL_EVERY } else { LOG_EVERY },
            last: Instant::now(),
            drawn: false,
        }
    }

    /// Shows the line `line` makes, if one is due.
    pub fn show(&mut self, line: impl FnOnce() -> String) {
        if self.last.elapsed() < self.every {
            return;
        }
        self.last = Instant::now();
        let line = format!("{}: {}", self.command, line());
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
            self.drawn = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
    }

    /// A line of its own, after clearing the progress line.
    pub fn say(&mut self, line: &str) {
        self.clear();
        eprintln!("{}: {line}", self.command);
    }

    /// Clears a progress line drawn on a terminal, before other output.
    pub fn clear(&mut self) {
        if self.drawn {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
            self.drawn = false;
        }
    }
}
