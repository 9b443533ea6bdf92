//! Reading a tool call's JSON object while it streams in: `{"name": "f", "arguments": {…}}`,
//! known as soon as its name is and followed byte by byte through its arguments, so the
//! arguments can stream as they are written. Until the call starts (its name and the start of
//! its arguments known), each push reads the object's short head again; from then on
//! [`ValueEnd`] reads only the arguments' new bytes, so a long call costs its length once, not
//! its length per token (issue 40).

/// Where one call object stands, read from its text so far.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Progress {
    /// The function's name, once its string is complete.
    pub name: Option<String>,
    /// A call id the object carries (Mistral's `"id"`).
    pub id: Option<String>,
    /// Where the arguments' value starts, and where it ends once it is complete.
    pub args: Option<(usize, Option<usize>)>,
    /// Just past the object's closing `}`.
    pub end: Option<usize>,
    /// The text cannot be a call object (it does not start with `{`, a key is not a string).
    pub bad: bool,
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// Just past the string that starts at `b[i] == '"'`; `None` while it is unfinished.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// Just past the JSON value that starts at `i`; `None` while it is unfinished (a number is
/// finished only by what follows it).
pub(crate) fn value_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i)? {
        b'"' => string_end(b, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                match b[j] {
                    b'"' => {
                        j = string_end(b, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let stop = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']') || c.is_ascii_whitespace())?;
            Some(i + stop)
        }
    }
}

/// Finds where a JSON object, array or string ends, reading only what is new at each call.
#[derive(Clone, Debug, Default)]
pub(crate) struct ValueEnd {
    /// Where reading goes on.
    at: Option<usize>,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl ValueEnd {
    /// Just past the value that starts at `b[start]` (`{`, `[` or `"`); `None` while it is
    /// unfinished. `b` only ever grows between calls, and `start` stays the same.
    pub(crate) fn find(&mut self, b: &[u8], start: usize) -> Option<usize> {
        let mut i = self.at.unwrap_or(start);
        while i < b.len() {
            let c = b[i];
            i += 1;
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, b'\\') => self.escaped = true,
                    (false, b'"') => {
                        self.in_string = false;
                        if self.depth == 0 {
                            self.at = Some(i);
                            return Some(i);
                        }
                    }
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.at = Some(i);
                        return Some(i);
                    }
                }
                _ => {}
            }
        }
        self.at = Some(i);
        None
    }
}

/// Reads `text` as a call object whose arguments are under one of `arg_keys`.
pub(crate) fn progress(text: &str, arg_keys: &[&str]) -> Progress {
    let b = text.as_bytes();
    let mut p = Progress::default();
    let mut i = skip_ws(b, 0);
    match b.get(i) {
        None => return p,
        Some(b'{') => i += 1,
        Some(_) => {
            p.bad = true;
            return p;
        }
    }
    loop {
        i = skip_ws(b, i);
        let Some(&c) = b.get(i) else { return p };
        match c {
            b'}' => {
                p.end = Some(i + 1);
                return p;
            }
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => {
                p.bad = true;
                return p;
            }
        }
        let Some(key_end) = string_end(b, i) else {
            return p;
        };
        let Ok(key) = serde_json::from_str::<String>(&text[i..key_end]) else {
            p.bad = true;
            return p;
        };
        i = skip_ws(b, key_end);
        match b.get(i) {
            None => return p,
            Some(b':') => i = skip_ws(b, i + 1),
            Some(_) => {
                p.bad = true;
                return p;
            }
        }
        if i >= b.len() {
            return p;
        }
        let end = value_end(b, i);
        if arg_keys.contains(&key.as_str()) {
            p.args = Some((i, end));
        }
        let Some(end) = end else { return p };
        let string = || serde_json::from_str::<String>(&text[i..end]).ok();
        match key.as_str() {
            "name" => p.name = string(),
            "id" => p.id = string(),
            _ => {}
        }
        i = end;
    }
}

/// A call's arguments as OpenAI carries them: JSON text. A model that wrote them as a JSON
/// string (`"{\"a\": 1}"`) meant the string's content.
pub(crate) fn arguments(raw: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(raw) {
        Ok(serde_json::Value::String(s)) => s,
        _ => raw.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_end_reads_only_what_is_new_and_agrees_with_value_end() {
        let text = r#"{"a": [1, "x]}\"", {"b": {}}], "c": "}"} tail"#;
        for start in [0, 6] {
            let want = value_end(text.as_bytes(), start);
            let mut v = ValueEnd::default();
            let got = (start + 1..=text.len()).find_map(|n| v.find(&text.as_bytes()[..n], start));
            assert_eq!(got, want, "from {start}");
        }
    }

    #[test]
    fn a_call_object_is_read_as_it_grows() {
        let full =
            r#"{"name": "get_weather", "arguments": {"city": "Paris", "n": [1, {"x": "}"}]}}"#;
        let keys = ["arguments"];
        let at = |n: usize| progress(&full[..n], &keys);
        assert_eq!(at(0), Progress::default());
        assert_eq!(at(10).name, None);
        let named = full.find("\",").unwrap() + 1;
        assert_eq!(at(named).name.as_deref(), Some("get_weather"));
        let args = full.find(": {").unwrap() + 2;
        assert_eq!(at(args + 1).args, Some((args, None)));
        let whole = at(full.len());
        assert_eq!(whole.args, Some((args, Some(full.len() - 1))));
        assert_eq!(whole.end, Some(full.len()));
        assert_eq!(
            &full[args..full.len() - 1],
            r#"{"city": "Paris", "n": [1, {"x": "}"}]}"#
        );
        assert!(progress("[1]", &keys).bad);
        assert!(progress("{name: 1}", &keys).bad);
    }

    #[test]
    fn arguments_given_as_a_string_are_the_strings_content() {
        assert_eq!(arguments(r#""{\"a\": 1}""#), r#"{"a": 1}"#);
        assert_eq!(arguments(r#"{"a": 1}"#), r#"{"a": 1}"#);
    }
}
