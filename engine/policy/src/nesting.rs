//! A linear pre-scan that bounds how deeply a policy document nests, before any parser sees it.
//!
//! The YAML scanner underneath serde_yaml does work proportional to the flow depth for every token
//! (its simple-key stack grows with each `[` or `{`), so 200 KB of `[[[[…` cost a minute before the
//! tree reader's depth check ever ran. This scan reads each byte once and tracks the nesting a
//! YAML (or JSON) parser would build: flow brackets and braces outside quoted scalars and comments,
//! and block collections by indentation and by `- `, `? ` and `key: ` on one line. Text of a block
//! scalar with an explicit indentation indicator may be counted as structure; a level that YAML
//! opens at its parent's indentation (`key:` then `- x` below it) is not counted, so what passes
//! has at most about twice the limit in real levels, and the scanner's work stays linear. It never
//! skips text a parser would read as structure: a quote opens a quoted scalar only where a node
//! starts, as in YAML, and every line break YAML knows ends a line.

/// A document nesting deeper than the pre-scan accepts.
#[derive(Debug, thiserror::Error)]
#[error(
    "line {line} nests deeper than {limit} levels (agentdiff checks nesting before parsing; \
     a policy needs at most four)"
)]
pub(crate) struct TooDeep {
    pub(crate) line: usize,
    pub(crate) limit: usize,
}

/// Refuse a document that nests more than `max_depth` levels below its root collection (the
/// depth the tree reader accepts).
pub(crate) fn check(text: &str, max_depth: usize) -> Result<(), TooDeep> {
    let mut scan = Scan {
        max_depth,
        line: 0,
        flow: 0,
        stack: Vec::new(),
        quote: None,
        node_start: true,
        after_closed: false,
        opened: true,
        block_scalar: None,
    };
    for (n, line) in text.split('\n').enumerate() {
        scan.line = n + 1;
        // YAML also breaks lines at CR, NEL, LS and PS: a parser reads each as a line of its own.
        for part in line.split(['\r', '\u{85}', '\u{2028}', '\u{2029}']) {
            scan.scan_line(part.as_bytes())?;
        }
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quote {
    Single,
    Double,
}

/// A block scalar (`|` or `>`) being skipped: lines indented more than `parent` are its text, once
/// the first of them sets the indentation (`content`), lines indented at least that much are.
#[derive(Debug, Clone, Copy)]
struct BlockScalar {
    parent: Option<usize>,
    content: Option<usize>,
}

struct Scan {
    max_depth: usize,
    line: usize,
    /// Open flow collections.
    flow: usize,
    /// Columns of the open block collections, innermost last.
    stack: Vec<usize>,
    /// Inside a quoted scalar (which may span lines).
    quote: Option<Quote>,
    /// The next character may start a node (so a quote there opens a quoted scalar).
    node_start: bool,
    /// The last token closed a quoted scalar or a flow collection (a `:` right after it is an
    /// indicator even without a following space, as in JSON).
    after_closed: bool,
    /// The last block line ended where a node starts (`key:`, `-`, properties): a line indented
    /// deeper opens a collection. Otherwise a deeper line continues a plain scalar.
    opened: bool,
    block_scalar: Option<BlockScalar>,
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// Whether the byte at `i` ends a token (end of line, space or tab).
fn ends_token(b: &[u8], i: usize) -> bool {
    b.get(i).map_or(true, |&c| is_blank(c))
}

impl Scan {
    fn depth_check(&self) -> Result<(), TooDeep> {
        // The count includes the root collection.
        if self.flow + self.stack.len() > self.max_depth + 1 {
            return Err(TooDeep {
                line: self.line,
                limit: self.max_depth,
            });
        }
        Ok(())
    }

    fn scan_line(&mut self, b: &[u8]) -> Result<(), TooDeep> {
        let mut i = 0;
        if self.quote.is_some() {
            i = self.skip_quoted(b, 0);
            if self.quote.is_some() {
                return Ok(());
            }
        } else if self.flow == 0 {
            match self.block_line_start(b) {
                Some(start) => i = start,
                None => return Ok(()),
            }
            self.depth_check()?;
        }
        self.scan_from(b, i)
    }

    /// Scan from `i`: flow text while a flow collection or quote is open, block text otherwise.
    fn scan_from(&mut self, b: &[u8], mut i: usize) -> Result<(), TooDeep> {
        let mut first = true;
        while i < b.len() {
            if self.flow > 0 || self.quote.is_some() {
                i = self.scan_flow(b, i)?;
                if self.flow == 0 && self.quote.is_none() {
                    // Closed on this line: a key if `:` follows, and its value comes next.
                    match value_indicator(b, i) {
                        Some(colon) => {
                            self.node_start = true;
                            i = colon + 1;
                        }
                        None => self.node_start = false,
                    }
                }
                first = false;
                continue;
            }
            match self.scan_block(b, i, first)? {
                Some(next) => i = next,
                None => break,
            }
            first = false;
        }
        if self.flow == 0 && self.quote.is_none() {
            self.opened = self.node_start;
        }
        Ok(())
    }

    /// Handle indentation at the start of a line in block context. `None`: skip the line.
    fn block_line_start(&mut self, b: &[u8]) -> Option<usize> {
        let indent = b.iter().take_while(|&&c| c == b' ').count();
        let rest = &b[indent..];
        let blank = rest.iter().all(|&c| is_blank(c));
        if let Some(mut bs) = self.block_scalar {
            if blank {
                return None;
            }
            let inside = match bs.content {
                Some(content) => indent >= content,
                None => bs.parent.map_or(true, |p| indent > p),
            };
            if inside {
                bs.content.get_or_insert(indent);
                self.block_scalar = Some(bs);
                return None;
            }
            self.block_scalar = None;
            // A block scalar ends its node: the line below is a sibling or an outer key.
            self.opened = false;
        }
        if blank || rest.first() == Some(&b'#') {
            return None;
        }
        if indent == 0 {
            let marker = |m: &[u8]| rest.starts_with(m) && ends_token(rest, 3);
            if marker(b"---") || marker(b"...") {
                self.stack.clear();
                self.opened = true;
                self.node_start = true;
                return if rest.starts_with(b"---") {
                    Some(3)
                } else {
                    None
                };
            }
            if rest.first() == Some(&b'%') {
                return None;
            }
        }
        while self.stack.last().is_some_and(|&top| top > indent) {
            self.stack.pop();
        }
        match self.stack.last() {
            Some(&top) if top == indent => {}
            // Deeper than its parent after a finished value: the continuation of a plain scalar.
            Some(_) if !self.opened => return None,
            _ => self.stack.push(indent),
        }
        self.node_start = true;
        self.after_closed = false;
        Some(indent)
    }

    /// One step of block text at `i` (a node start, an indicator, or a scalar). `first`: the node
    /// at the line's indentation, already counted. Returns where to continue, or `None` at the
    /// end of what the line can nest.
    fn scan_block(&mut self, b: &[u8], i: usize, first: bool) -> Result<Option<usize>, TooDeep> {
        let c = b[i];
        if is_blank(c) {
            return Ok(Some(i + 1));
        }
        if !self.node_start {
            return Ok(None);
        }
        match c {
            b'#' => Ok(None),
            b'-' | b'?' if ends_token(b, i + 1) => {
                // `- - x` and `- key: v`: a collection that starts on the line of its parent.
                if !first {
                    self.stack.push(i);
                    self.depth_check()?;
                }
                Ok(Some(i + 1))
            }
            b'&' | b'!' => Ok(Some(skip_token(b, i))),
            b'|' | b'>' => {
                self.block_scalar = Some(BlockScalar {
                    parent: self.stack.last().copied(),
                    content: None,
                });
                self.node_start = false;
                Ok(None)
            }
            b'*' => {
                self.node_start = false;
                Ok(None)
            }
            b'[' | b'{' | b'"' | b'\'' => self.enter(b, i, first),
            _ => Ok(self.plain_key(b, i, first)?),
        }
    }

    /// A flow collection or quoted scalar starting a block node at `i`.
    fn enter(&mut self, b: &[u8], i: usize, first: bool) -> Result<Option<usize>, TooDeep> {
        let next = self.scan_flow(b, i)?;
        if self.flow > 0 || self.quote.is_some() {
            return Ok(Some(next));
        }
        // A closed flow collection or quoted scalar used as a key: a mapping starts here.
        if let Some(colon) = value_indicator(b, next) {
            if !first {
                self.stack.push(i);
                self.depth_check()?;
            }
            self.node_start = true;
            return Ok(Some(colon + 1));
        }
        self.node_start = false;
        Ok(None)
    }

    /// A plain scalar at `i`: a key if `: ` follows on the line, else a value that ends the line.
    fn plain_key(&mut self, b: &[u8], i: usize, first: bool) -> Result<Option<usize>, TooDeep> {
        let mut j = i;
        while j < b.len() {
            match b[j] {
                b':' if ends_token(b, j + 1) => {
                    if !first {
                        self.stack.push(i);
                        self.depth_check()?;
                    }
                    self.node_start = true;
                    return Ok(Some(j + 1));
                }
                b'#' if j > i && is_blank(b[j - 1]) => break,
                _ => j += 1,
            }
        }
        self.node_start = false;
        Ok(None)
    }

    /// Flow text (or a quoted scalar) from `i`, up to just past the point where no flow
    /// collection or quote is open any more, or to the end of the line.
    fn scan_flow(&mut self, b: &[u8], mut i: usize) -> Result<usize, TooDeep> {
        while i < b.len() {
            if self.quote.is_some() {
                i = self.skip_quoted(b, i);
                if self.quote.is_none() && self.flow == 0 {
                    return Ok(i);
                }
                continue;
            }
            let c = b[i];
            let closed = std::mem::take(&mut self.after_closed);
            match c {
                b' ' | b'\t' => self.after_closed = closed,
                b'#' if i == 0 || is_blank(b[i - 1]) => return Ok(b.len()),
                b'[' | b'{' => {
                    self.flow += 1;
                    self.depth_check()?;
                    self.node_start = true;
                }
                b']' | b'}' => {
                    self.flow = self.flow.saturating_sub(1);
                    self.node_start = false;
                    self.after_closed = true;
                    if self.flow == 0 {
                        return Ok(i + 1);
                    }
                }
                b',' => self.node_start = true,
                b':' => {
                    self.node_start = closed
                        || b.get(i + 1)
                            .map_or(true, |&n| is_blank(n) || b",[]{}".contains(&n));
                }
                b'?' | b'-' if self.node_start && ends_token(b, i + 1) => {}
                b'"' | b'\'' if self.node_start => {
                    self.quote = Some(if c == b'"' {
                        Quote::Double
                    } else {
                        Quote::Single
                    });
                    self.node_start = false;
                }
                b'&' | b'!' if self.node_start => {
                    i = skip_token(b, i);
                    continue;
                }
                _ => self.node_start = false,
            }
            i += 1;
        }
        Ok(i)
    }

    /// Inside a quoted scalar at `i`: skip to just past its closing quote (or the end of line).
    fn skip_quoted(&mut self, b: &[u8], mut i: usize) -> usize {
        while i < b.len() {
            match (self.quote, b[i]) {
                (Some(Quote::Double), b'\\') => i += 2,
                (Some(Quote::Double), b'"') => {
                    self.quote = None;
                    self.after_closed = true;
                    return i + 1;
                }
                (Some(Quote::Single), b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
                (Some(Quote::Single), b'\'') => {
                    self.quote = None;
                    self.after_closed = true;
                    return i + 1;
                }
                _ => i += 1,
            }
        }
        b.len()
    }
}

/// The position of a `:` value indicator at or after `i` (past blanks), if that is what follows.
fn value_indicator(b: &[u8], i: usize) -> Option<usize> {
    let j = i + b[i.min(b.len())..]
        .iter()
        .take_while(|&&c| is_blank(c))
        .count();
    (b.get(j) == Some(&b':') && ends_token(b, j + 1)).then_some(j)
}

/// Past a property (`&anchor`, `!tag`) starting at `i`.
fn skip_token(b: &[u8], i: usize) -> usize {
    i + b[i..]
        .iter()
        .take_while(|&&c| !is_blank(c) && !b",[]{}".contains(&c))
        .count()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn depth_ok(text: &str, max_depth: usize) -> bool {
        check(text, max_depth).is_ok()
    }

    #[test]
    fn flow_nesting_is_counted_outside_quotes_and_comments() {
        assert!(depth_ok("x: [[[a]]]\n", 3));
        assert!(!depth_ok("x: [[[[a]]]]\n", 3));
        assert!(!depth_ok("x: {a: {b: {c: {d: 1}}}}\n", 3));
        assert!(depth_ok("x: [\"[[[[[\", '[[[[', a]\n", 1));
        assert!(depth_ok("x: [a] # [[[[[[\n", 1));
        assert!(depth_ok("x: \"a\\\"[[[[[\"\n", 0));
        assert!(depth_ok("x: 'it''s [[[[['\n", 0));
        // A quote inside a plain scalar does not open a quoted scalar.
        assert!(!depth_ok("x: [a'b, [[[[c]]]]]\n", 3));
        assert!(!depth_ok("x: [a \"b, [[[[c]]]]]\n", 3));
        // A multi-line quoted scalar hides nothing after it closes, nor does a quoted key.
        assert!(!depth_ok("x: \"a\n  b\" \ny: [[[[[1]]]]]\n", 3));
        assert!(!depth_ok("\"x\": [[[[[1]]]]]\n", 3));
        // Nor a flow key closed on a later line, nor a line break YAML knows but Rust's lines do not.
        assert!(!depth_ok("[a,\n b]: [[[[[1]]]]]\n", 3));
        assert!(!depth_ok("a: b\u{2028}c: [[[[[1]]]]]\n", 3));
        assert!(!depth_ok("a: b\rc: [[[[[1]]]]]\n", 3));
        // JSON.
        assert!(depth_ok("{\"a\":{\"b\":[1]}}", 3));
        assert!(!depth_ok("{\"a\":{\"b\":[[1]]}}", 2));
        assert!(!depth_ok(&"[".repeat(100), 16));
    }

    #[test]
    fn block_nesting_is_counted_by_indentation_and_on_one_line() {
        assert!(depth_ok("a:\n  b:\n    c: 1\n", 2));
        assert!(!depth_ok("a:\n  b:\n    c:\n      d: 1\n", 2));
        assert!(!depth_ok("x:\n  - - - - a\n", 3));
        assert!(!depth_ok("x:\n  - a: - b: - c: 1\n", 3));
        assert!(!depth_ok("? ? ? ? ? a\n", 3));
        // A continuation line of a plain scalar is no deeper level.
        assert!(depth_ok("a: one\n  two\n    three\n      four\n", 0));
        // Neither is the text of a block scalar, however it is indented or bracketed.
        assert!(depth_ok("a: |\n  [[[[[\n    b:\n      c:\nd: 1\n", 0));
        // But the block scalar ends where its indentation does.
        assert!(!depth_ok("- a: |\n    text\n  b:\n    c:\n      d: 1\n", 2));
        assert!(depth_ok("---\na: 1\n...\n---\nb: [1]\n", 1));
        assert!(!depth_ok("--- [[[[1]]]]\n", 2));
    }

    /// A tree `depth` levels deep whose scalars carry YAML's special characters.
    fn tree(depth: u32, texts: Vec<String>) -> serde_json::Value {
        let mut value = serde_json::Value::from(texts.clone());
        for (i, text) in (0..depth).zip(texts.iter().cycle()) {
            value = if i % 3 == 0 {
                serde_json::json!([text, value, text])
            } else {
                // The key ends in `0`, so it is never the other key.
                serde_json::json!({ format!("{text}0"): value, "k": text })
            };
        }
        value
    }

    proptest::proptest! {
        /// What serde_yaml and serde_json write for a tree the reader accepts passes the scan,
        /// whatever quotes, brackets, `#`, `:` and line breaks its strings hold; a tree more
        /// than twice as deep as the limit never does.
        #[test]
        fn serialised_trees_are_measured(
            depth in 0u32..40,
            texts in proptest::collection::vec("[a-z\\[\\]{}'\"#:,&*!|> \\n-]{0,8}", 1..4),
        ) {
            let value = tree(depth, texts);
            let yaml = serde_yaml::to_string(&value).unwrap();
            let json = serde_json::to_string(&value).unwrap();
            let pretty = serde_json::to_string_pretty(&value).unwrap();
            for text in [&yaml, &json, &pretty] {
                // The innermost list sits at `depth`, its strings one deeper.
                if depth < 16 {
                    proptest::prop_assert!(check(text, 16).is_ok(), "{}", text);
                }
                if depth > 33 {
                    proptest::prop_assert!(check(text, 16).is_err(), "{}", text);
                }
            }
        }
    }
}
