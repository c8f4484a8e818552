//! The shell blocks our docs mark to be run as tests: a fenced block whose previous line is
//! `<!-- MARK -->` (`walkthrough` in docs/operations.md, `quickstart` and `quickstart-image` in
//! the kit's QUICKSTART.md). A test runs them in order, as one shell session, so that a step a
//! reader follows cannot stop working unseen.

/// The bodies of the blocks marked `<!-- mark -->` in `page`, in order.
pub fn marked_blocks(page: &str, mark: &str) -> Vec<String> {
    let marker = format!("<!-- {mark} -->");
    let mut blocks = Vec::new();
    let mut lines = page.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() != marker {
            continue;
        }
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "`{marker}` must stand right above a fenced block, not above {fence:?}"
        );
        let mut body = String::new();
        for l in lines.by_ref() {
            if l.starts_with("```") {
                break;
            }
            body.push_str(l);
            body.push('\n');
        }
        blocks.push(body);
    }
    blocks
}

/// The marked blocks as one script for `bash`, stopping at the first command that fails
/// (`set -euo pipefail`), each block announced on stderr as it starts.
pub fn script(page: &str, mark: &str) -> String {
    let mut s = String::from("set -euo pipefail\n");
    for (i, block) in marked_blocks(page, mark).iter().enumerate() {
        s.push_str(&format!("echo '--- {mark} block {}' >&2\n", i + 1));
        s.push_str(block);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_blocks_are_taken_in_order() {
        let page = "text\n```sh\nnot this\n```\n<!-- w -->\n```sh\necho 1\necho 2\n```\n\
                    <!-- other -->\n```sh\nno\n```\n<!-- w -->\n```sh\necho 3\n```\n";
        assert_eq!(
            marked_blocks(page, "w"),
            vec!["echo 1\necho 2\n", "echo 3\n"]
        );
        assert!(script(page, "w").starts_with("set -euo pipefail\n"));
        assert!(script(page, "w").contains("echo 3"));
        assert!(marked_blocks(page, "none").is_empty());
    }
}
