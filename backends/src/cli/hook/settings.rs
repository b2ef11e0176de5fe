//! Claude Code's settings file, as far as `hook install` edits it: the `hooks` table.
//!
//! Invariants: every key agentdiff does not model (other settings, other events' fields, a
//! matcher group's or a hook's own extra fields) is carried through unchanged (`flatten`); the
//! only hook entries added, replaced or removed are agentdiff's own ([`is_ours`]: a `command`
//! whose program is named `agentdiff` and whose first argument is `hook`); a group that held
//! only agentdiff's entries is removed with them, any other group stays where it was. An install
//! over an identical installation changes nothing.
//!
//! Not kept: the order of the file's object keys (the JSON model sorts them) and its
//! formatting; the backup written before every change holds the original text.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The settings document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hooks: Option<BTreeMap<String, Vec<MatcherGroup>>>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One entry of an event's list: a matcher and its hooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatcherGroup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    #[serde(default)]
    pub hooks: Vec<HookEntry>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// One hook of a group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookEntry {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<serde_json::Number>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// A hook agentdiff installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub event: &'static str,
    pub matcher: Option<&'static str>,
    pub command: String,
    /// Claude Code's timeout for the hook, in seconds.
    pub timeout: u64,
}

impl Wanted {
    fn entry(&self) -> HookEntry {
        HookEntry {
            kind: "command".to_owned(),
            command: Some(self.command.clone()),
            timeout: Some(self.timeout.into()),
            other: Map::new(),
        }
    }
}

/// What a merge did, for the user.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub added: Vec<String>,
    pub replaced: Vec<String>,
    pub removed: Vec<String>,
    /// Hooks of others left in place.
    pub kept: usize,
}

impl Changes {
    pub fn any(&self) -> bool {
        !(self.added.is_empty() && self.replaced.is_empty() && self.removed.is_empty())
    }
}

/// Whether `command` runs agentdiff's hook: its first shell word names a program called
/// `agentdiff` (any directory, quoted or not) and the next word is `hook`.
pub fn is_ours(command: &str) -> bool {
    let mut words = shell_words(command);
    let program = words.next().unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or_default();
    name == "agentdiff" && words.next().as_deref() == Some("hook")
}

/// Options agentdiff sets itself in the commands it installs, each with one value: an entry
/// that carries another value for one of them is simply replaced.
const OWN_OPTIONS: [&str; 3] = ["--root", "--deadline", "--runtime"];

/// For every agentdiff entry already in `settings`, the arguments the wanted entry of its event
/// does not carry (a user's `--policy strict.yaml`), described for the user: replacing the entry
/// would drop them.
pub fn dropped_arguments(settings: &Settings, wanted: &[Wanted]) -> Vec<String> {
    let mut out = Vec::new();
    for (event, groups) in settings.hooks.iter().flatten() {
        for entry in groups.iter().flat_map(|g| &g.hooks) {
            let Some(old) = entry.command.as_deref().filter(|c| is_ours(c)) else {
                continue;
            };
            let new = wanted
                .iter()
                .find(|w| w.event == event)
                .map_or("", |w| w.command.as_str());
            let dropped = extra_words(old, new);
            if !dropped.is_empty() {
                out.push(format!("{event}: {}", dropped.join(" ")));
            }
        }
    }
    out
}

/// The words of `old` after `PROGRAM hook SUBCOMMAND` that `new` lacks, leaving out the options
/// agentdiff sets itself and the `|| exit 2` it appends.
fn extra_words(old: &str, new: &str) -> Vec<String> {
    let new_words: Vec<String> = shell_words(new).skip(3).collect();
    let mut out = Vec::new();
    let mut words = shell_words(old).skip(3);
    while let Some(word) = words.next() {
        let flag = word.split_once('=').map_or(word.as_str(), |(f, _)| f);
        if OWN_OPTIONS.contains(&flag) {
            if flag == word {
                words.next();
            }
            continue;
        }
        if matches!(word.as_str(), "||" | "exit" | "2") || new_words.contains(&word) {
            continue;
        }
        out.push(word);
    }
    out
}

/// The leading words of a shell command, unquoted (single and double quotes, backslashes).
/// Enough to recognise a program and its first argument, not a shell parser.
fn shell_words(text: &str) -> impl Iterator<Item = String> + '_ {
    let mut chars = text.chars().peekable();
    std::iter::from_fn(move || {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        chars.peek()?;
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                c if c.is_whitespace() => break,
                '\'' => word.extend(chars.by_ref().take_while(|&c| c != '\'')),
                '"' => {
                    while let Some(c) = chars.next() {
                        match c {
                            '"' => break,
                            '\\' => word.extend(chars.next()),
                            c => word.push(c),
                        }
                    }
                }
                '\\' => word.extend(chars.next()),
                c => word.push(c),
            }
        }
        Some(word)
    })
}

fn describe(event: &str, matcher: Option<&str>, entry: &HookEntry) -> String {
    let matcher = matcher
        .map(|m| format!(" (matcher `{m}`)"))
        .unwrap_or_default();
    let timeout = entry
        .timeout
        .as_ref()
        .map(|t| format!(", timeout {t} s"))
        .unwrap_or_default();
    format!(
        "{event}{matcher}: {}{timeout}",
        entry.command.as_deref().unwrap_or("")
    )
}

/// Replaces agentdiff's hooks in `settings` by `wanted` (none: uninstall). An entry of ours in
/// a group whose event and matcher a wanted hook has is replaced where it stands; other entries
/// of ours are removed; wanted hooks not placed that way are appended as groups of their own.
pub fn merge(settings: &mut Settings, wanted: &[Wanted]) -> Changes {
    let mut changes = Changes::default();
    let mut placed = vec![false; wanted.len()];
    let had_hooks = settings.hooks.is_some();
    let hooks = settings.hooks.get_or_insert_with(BTreeMap::new);
    let mut emptied = Vec::new();
    for (event, groups) in hooks.iter_mut() {
        let before = groups.len();
        groups.retain_mut(|group| {
            let mut touched = false;
            let mut kept = Vec::with_capacity(group.hooks.len());
            for entry in std::mem::take(&mut group.hooks) {
                if !entry.command.as_deref().is_some_and(is_ours) {
                    changes.kept += 1;
                    kept.push(entry);
                    continue;
                }
                touched = true;
                let slot = wanted.iter().enumerate().position(|(i, w)| {
                    !placed[i] && w.event == event && w.matcher == group.matcher.as_deref()
                });
                match slot {
                    Some(i) => {
                        placed[i] = true;
                        let new = wanted[i].entry();
                        if new != entry {
                            changes.replaced.push(format!(
                                "{} -> {}",
                                describe(event, group.matcher.as_deref(), &entry),
                                describe(event, group.matcher.as_deref(), &new)
                            ));
                        }
                        kept.push(new);
                    }
                    None => changes
                        .removed
                        .push(describe(event, group.matcher.as_deref(), &entry)),
                }
            }
            group.hooks = kept;
            // A group emptied by removing ours goes; a group the user left empty stays.
            !(touched && group.hooks.is_empty())
        });
        if groups.is_empty() && before > 0 {
            emptied.push(event.clone());
        }
    }
    // An event list emptied by removing ours goes; one the user left empty stays. So does a
    // table emptied that way.
    let emptied_any = !emptied.is_empty();
    for event in emptied {
        hooks.remove(&event);
    }
    for (i, w) in wanted.iter().enumerate() {
        if placed[i] {
            continue;
        }
        let group = MatcherGroup {
            matcher: w.matcher.map(str::to_owned),
            hooks: vec![w.entry()],
            other: Map::new(),
        };
        changes
            .added
            .push(describe(w.event, w.matcher, &group.hooks[0]));
        hooks.entry(w.event.to_owned()).or_default().push(group);
    }
    if hooks.is_empty() && (!had_hooks || emptied_any) {
        settings.hooks = None;
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> Vec<Wanted> {
        vec![Wanted {
            event: "PreToolUse",
            matcher: Some("*"),
            command: "'/usr/bin/agentdiff' hook pre-tool-use --root \"$CLAUDE_PROJECT_DIR\""
                .to_owned(),
            timeout: 30,
        }]
    }

    fn parse(text: &str) -> Settings {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn recognises_agentdiff_commands_only() {
        assert!(is_ours("agentdiff hook pre-tool-use"));
        assert!(is_ours("'/opt/x y/agentdiff' hook pre-tool-use || exit 2"));
        assert!(is_ours("\"/usr/local/bin/agentdiff\" hook session-start"));
        assert!(!is_ours("agentdiff run -- make"));
        assert!(!is_ours("my-agentdiff hook pre-tool-use"));
        assert!(!is_ours("echo agentdiff hook"));
        assert!(!is_ours(""));
    }

    #[test]
    fn keeps_other_hooks_and_settings() {
        let mut s = parse(
            r#"{"model":"x","hooks":{"PreToolUse":[{"matcher":"Bash","hooks":[
                {"type":"command","command":"./lint.sh","timeout":9,"extra":true}]}],
                "Stop":[{"hooks":[{"type":"command","command":"notify"}]}]}}"#,
        );
        let original = s.clone();
        let changes = merge(&mut s, &wanted());
        assert_eq!(changes.added.len(), 1, "{changes:?}");
        assert_eq!(changes.kept, 2);
        let hooks = s.hooks.as_ref().unwrap();
        assert_eq!(
            hooks["PreToolUse"][0],
            original.hooks.as_ref().unwrap()["PreToolUse"][0]
        );
        assert_eq!(hooks["PreToolUse"].len(), 2);
        assert_eq!(hooks["Stop"], original.hooks.as_ref().unwrap()["Stop"]);
        assert_eq!(s.other["model"], "x");
        // Again: nothing changes.
        let again = s.clone();
        let changes = merge(&mut s, &wanted());
        assert!(!changes.any(), "{changes:?}");
        assert_eq!(s, again);
        // Uninstall: back to the original.
        let changes = merge(&mut s, &[]);
        assert_eq!(changes.removed.len(), 1);
        assert_eq!(s, original);
    }

    #[test]
    fn replaces_an_older_installation_in_place() {
        let mut s = parse(
            r#"{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[
                {"type":"command","command":"agentdiff hook pre-tool-use --root \"$CLAUDE_PROJECT_DIR\"","timeout":30}]},
                {"matcher":"Bash","hooks":[{"type":"command","command":"./mine"}]}]}}"#,
        );
        let changes = merge(&mut s, &wanted());
        assert_eq!(changes.replaced.len(), 1, "{changes:?}");
        let groups = &s.hooks.as_ref().unwrap()["PreToolUse"];
        assert_eq!(groups.len(), 2);
        assert_eq!(
            groups[0].hooks[0].command,
            Some(wanted()[0].command.clone())
        );
        assert_eq!(groups[1].hooks[0].command.as_deref(), Some("./mine"));
    }

    #[test]
    fn an_empty_file_gets_no_empty_hooks_table_back() {
        let mut s = parse("{}");
        merge(&mut s, &wanted());
        merge(&mut s, &[]);
        assert_eq!(s, parse("{}"));
        let mut s = parse(r#"{"hooks":{}}"#);
        merge(&mut s, &[]);
        assert_eq!(s, parse(r#"{"hooks":{}}"#));
    }

    #[test]
    fn arguments_a_replacement_would_drop_are_named() {
        let s = parse(
            r#"{"hooks":{"PreToolUse":[{"matcher":"*","hooks":[
                {"type":"command","command":"/usr/local/bin/agentdiff hook pre-tool-use --policy strict.yaml --deadline 9s"},
                {"type":"command","command":"agentdiff hook pre-tool-use --root=/x --runtime srt || exit 2"}
            ]}]}}"#,
        );
        assert_eq!(
            dropped_arguments(&s, &wanted()),
            vec!["PreToolUse: --policy strict.yaml".to_owned()]
        );
        // The same arguments in the new entry: nothing dropped.
        let mut carried = wanted();
        carried[0].command.push_str(" --policy strict.yaml");
        assert!(dropped_arguments(&s, &carried).is_empty());
    }
}
