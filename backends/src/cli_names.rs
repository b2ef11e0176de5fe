//! The check that no subcommand file names a built-in backend (test-only).
//!
//! Registration in `main.rs` (`use agentdiff_backend_x as _;`) is the one place the binary names
//! a backend. The check reads every `.rs` file under `src/cli/` (at any depth) through a small
//! Rust lexer, so a name cannot hide from it in a string literal split across lines (`"sr\` +
//! newline + `t"`), an escape (`"\x73rt"`), a raw string, `concat!`, a crate path, or behind an
//! early `#[cfg(test)]` in a string. Comments and items under `#[cfg(test)]` are not read.
//! `#[path]` and `include!` are refused outright, since they pull in code the check cannot see.
//!
//! Not defended: names built at run time from pieces (`format!("{}{}", "sr", "t")`); review
//! catches those.

/// One mention: 1-based line and what was found.
pub type Mention = (usize, String);

/// Tokens of interest: identifiers and the decoded contents of string literals.
#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    Str(String),
    Punct(char),
}

/// Lex Rust source into tokens with their line; comments are dropped.
fn lex(src: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' || ((c == 'b' || c == 'c') && at(i + 1) == '"') {
            let start = line;
            i += if c == '"' { 1 } else { 2 };
            let mut s = String::new();
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                    match at(i) {
                        '\n' => {
                            // Continuation: the newline and the next line's indent vanish.
                            while i < chars.len() && chars[i].is_whitespace() {
                                if chars[i] == '\n' {
                                    line += 1;
                                }
                                i += 1;
                            }
                            continue;
                        }
                        'n' => s.push('\n'),
                        't' => s.push('\t'),
                        'r' => s.push('\r'),
                        '0' => s.push('\0'),
                        'x' => {
                            let hex: String =
                                chars[i + 1..(i + 3).min(chars.len())].iter().collect();
                            s.extend(u8::from_str_radix(&hex, 16).ok().map(char::from));
                            i += 2;
                        }
                        'u' => {
                            let end = (i..chars.len()).find(|&j| chars[j] == '}').unwrap_or(i);
                            let hex: String = chars[(i + 2).min(end)..end].iter().collect();
                            s.extend(u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32));
                            i = end;
                        }
                        other => s.push(other),
                    }
                    i += 1;
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    s.push(chars[i]);
                    i += 1;
                }
            }
            i += 1;
            out.push((start, Token::Str(s)));
        } else if (c == 'r' && matches!(at(i + 1), '"' | '#'))
            || ((c == 'b' || c == 'c') && at(i + 1) == 'r' && matches!(at(i + 2), '"' | '#'))
        {
            let start = line;
            let from = i + if c == 'r' { 1 } else { 2 };
            let hashes = (from..chars.len()).take_while(|&j| chars[j] == '#').count();
            if at(from + hashes) != '"' {
                // A raw identifier (`r#type`): read on as an identifier.
                i = from + hashes;
                continue;
            }
            i = from + hashes + 1;
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let rest: String = chars[i.min(chars.len())..].iter().collect();
            let len = rest.find(&close).unwrap_or(rest.len());
            let body = &rest[..len];
            line += body.matches('\n').count();
            i += body.chars().count() + close.chars().count();
            out.push((start, Token::Str(body.to_string())));
        } else if c == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime / label ('a, 'static).
            if at(i + 1) == '\\' {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((line, Token::Ident(chars[start..i].iter().collect())));
        } else {
            out.push((line, Token::Punct(c)));
            i += 1;
        }
    }
    out
}

/// Drop every item under `#[cfg(test)]`: the attribute, then the item up to its `;` or the
/// end of its braces (whichever comes first at depth 0).
fn without_test_items(tokens: &[(usize, Token)]) -> Vec<&(usize, Token)> {
    let ident = |t: &Token, want: &str| matches!(t, Token::Ident(s) if s == want);
    let cfg_test = |w: &[(usize, Token)]| {
        w.len() >= 7
            && w[0].1 == Token::Punct('#')
            && w[1].1 == Token::Punct('[')
            && ident(&w[2].1, "cfg")
            && w[3].1 == Token::Punct('(')
            && ident(&w[4].1, "test")
            && w[5].1 == Token::Punct(')')
            && w[6].1 == Token::Punct(']')
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if !cfg_test(&tokens[i..]) {
            out.push(&tokens[i]);
            i += 1;
            continue;
        }
        i += 7;
        let mut depth = 0usize;
        while let Some((_, t)) = tokens.get(i) {
            i += 1;
            match t {
                Token::Punct('{') => depth += 1,
                Token::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        break;
                    }
                }
                Token::Punct(';') if depth == 0 => break,
                _ => {}
            }
        }
    }
    out
}

/// The contract crate every subcommand may use (`agentdiff_backend_api`) shares the backend crates'
/// prefix; its exact name, as a whole word, is not a backend crate. A longer name that starts
/// with it (`agentdiff_backend_apix`) still is.
fn without_contract_crate(lower: &str) -> String {
    let mut out = String::with_capacity(lower.len());
    let mut rest = lower;
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    while let Some(at) = rest.find("agentdiff").filter(|_| !rest.is_empty()) {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let len = ["agentdiff_backend_api", "agentdiff-backend-api"]
            .iter()
            .find(|name| from.starts_with(*name) && !from[name.len()..].starts_with(word))
            .map(|name| name.len());
        match len {
            Some(n) => rest = &from[n..],
            None => {
                out.push_str("agentdiff");
                rest = &from["agentdiff".len()..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Lower-case words of a text: runs of letters, digits and `_`.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// Where `src` (one source file) names one of `ids` or a backend crate, outside comments and
/// `#[cfg(test)]` items; `#[path]` and `include!` count as mentions too.
pub fn mentions(src: &str, ids: &[&str]) -> Vec<Mention> {
    let tokens = lex(src);
    let code = without_test_items(&tokens);
    let mut found = Vec::new();
    let check = |found: &mut Vec<Mention>, line: usize, text: &str| {
        let lower = without_contract_crate(&text.to_lowercase());
        if lower.contains("agentdiff_backend_") || lower.contains("agentdiff-backend-") {
            found.push((line, format!("a backend crate: {text}")));
        }
        for w in words(text) {
            if ids.contains(&w.as_str()) {
                found.push((line, format!("backend `{w}`")));
            }
        }
    };
    // Literals joined by `concat!` are checked as the one string they make.
    let mut joined: Option<(usize, String, usize)> = None;
    for (k, (line, t)) in code.iter().map(|t| (t.0, &t.1)).enumerate() {
        match t {
            Token::Ident(name) => {
                check(&mut found, line, name);
                let next = |n: usize| code.get(k + n).map(|t| &t.1);
                if matches!(name.as_str(), "include" | "include_str" | "include_bytes")
                    && next(1) == Some(&Token::Punct('!'))
                {
                    found.push((
                        line,
                        format!("{name}! pulls in code this check cannot read"),
                    ));
                }
                if name == "path" && k > 0 && code[k - 1].1 == Token::Punct('[') {
                    found.push((line, "#[path] points outside this check".into()));
                }
                if name == "concat" && next(1) == Some(&Token::Punct('!')) {
                    joined = Some((line, String::new(), 0));
                }
            }
            Token::Str(text) => {
                check(&mut found, line, text);
                if let Some((_, acc, _)) = joined.as_mut() {
                    acc.push_str(text);
                }
            }
            Token::Punct(p) => {
                if let Some((start, acc, depth)) = joined.as_mut() {
                    match p {
                        '(' | '[' | '{' => *depth += 1,
                        ')' | ']' | '}' => {
                            *depth = depth.saturating_sub(1);
                            if *depth == 0 {
                                let (start, acc) = (*start, std::mem::take(acc));
                                joined = None;
                                check(&mut found, start, &acc);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::mentions;

    const IDS: &[&str] = &["bwrap", "container", "local", "srt"];

    fn named(src: &str) -> bool {
        !mentions(src, IDS).is_empty()
    }

    #[test]
    fn plain_names_in_code_and_strings_are_found() {
        assert!(named("fn f() { if id == \"srt\" {} }"));
        assert!(named("let Container = 1;"));
        assert!(named("const X: &str = r#\"uses bwrap\"#;"));
        assert!(named("const X: &[u8] = b\"local\";"));
    }

    #[test]
    fn split_and_escaped_literals_are_found() {
        assert!(named("const X: &str = \"sr\\\n        t\";"));
        assert!(named("const X: &str = \"\\x73rt\";"));
        assert!(named("const X: &str = \"\\u{62}wrap\";"));
        assert!(named("const X: &str = concat!(\"sr\",\n \"t\");"));
    }

    #[test]
    fn the_contract_crate_is_not_a_backend_crate_but_a_longer_name_is() {
        assert!(!named(
            "use agentdiff_backend_api::{Registry, RuntimeBackend};"
        ));
        assert!(!named("const X: &str = \"see agentdiff-backend-api\";"));
        assert!(named("use agentdiff_backend_apix::Thing;"));
        assert!(named("use agentdiff_backend_api_local::Thing;"));
        assert!(named(
            "use agentdiff_backend_api::X; use agentdiff_backend_x::Y;"
        ));
    }

    #[test]
    fn crate_paths_and_code_from_elsewhere_are_found() {
        assert!(named("use ::agentdiff_backend_x::Thing;"));
        assert!(named("fn f() { agentdiff_backend_x::go() }"));
        assert!(named("#[path = \"../x.rs\"] mod x;"));
        assert!(named("include!(\"../x.rs\");"));
    }

    #[test]
    fn a_cfg_test_in_a_string_or_comment_does_not_end_the_scan() {
        assert!(named(
            "const A: &str = \"#[cfg(test)]\";\nconst B: &str = \"srt\";"
        ));
        assert!(named("// #[cfg(test)]\nconst B: &str = \"srt\";"));
        // A gated item is skipped; the code after it is still read.
        assert!(named(
            "#[cfg(test)]\nfn t() { \"srt\"; }\nconst B: &str = \"srt\";"
        ));
        assert!(named("#[cfg(test)]\nuse x::y;\nconst B: &str = \"srt\";"));
    }

    #[test]
    fn comments_test_items_and_other_words_are_not_mentions() {
        assert!(!named(
            "// the srt backend\n/* bwrap /* nested */ container */ fn f() {}"
        ));
        assert!(!named(
            "#[cfg(test)]\nmod tests { const X: &str = \"local\"; }"
        ));
        assert!(!named(
            "fn f<'a>(x: &'a str) -> char { let local_path = 'l'; 'c' }"
        ));
        assert!(!named(
            "const X: &str = \"descriptors name their options\";"
        ));
    }
}
