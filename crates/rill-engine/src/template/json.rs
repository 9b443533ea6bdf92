//! `tojson` for chat templates, as Hugging Face's: Python's `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)`. Templates write tool schemas and arguments
//! with it, and the model saw that exact text in training: `{"a": 1, "b": [1, 2]}`, with
//! Python's spaces after `,` and `:`, non-ASCII text as it is and nothing escaped for HTML
//! (minijinja's own `tojson` writes compact, HTML-safe JSON). Dicts and lists printed as they
//! are (`{{ tool }}`, `tool|string`) come out as Python's `str()` writes them, `{'a': True}`,
//! as jinja2 prints them ([`formatter`], [`python_string`]). Also Hugging Face's
//! `{% generation %}` tag (it marks the assistant's text for training masks, and renders its
//! body), which minijinja does not know.

use minijinja::value::{Kwargs, Value};
use minijinja::Error;

use super::limits::{within, MAX_INDENT};

/// How Python's `json.dumps` is asked to write.
struct Style {
    indent: Option<String>,
    item: String,
    key: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The filter: `x | tojson`, `x | tojson(indent=2)`, `tojson(separators=(",", ":"))`, …
pub fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => Some(match v.as_i64() {
            Some(n) if n > MAX_INDENT as i64 => {
                super::limits::trip();
                return Err(Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    format!("tojson: indent {n} is wider than {MAX_INDENT}"),
                ));
            }
            Some(n) => " ".repeat(n.max(0) as usize),
            None => v.as_str().unwrap_or("").chars().take(MAX_INDENT).collect(),
        }),
        None => None,
    };
    let (item, key) = match kwargs.get::<Option<Value>>("separators")? {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s
                .try_iter()?
                .take(3)
                .map(|p| p.as_str().unwrap_or("").chars().take(MAX_INDENT).collect())
                .collect();
            match parts.as_slice() {
                [i, k] => (i.clone(), k.clone()),
                _ => {
                    return Err(Error::new(
                        minijinja::ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        // Python's defaults: a space after `,` unless indenting, always after `:`.
        _ => (
            if indent.is_some() { "," } else { ", " }.to_owned(),
            ": ".to_owned(),
        ),
    };
    let style = Style {
        indent,
        item,
        key,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write(value, &style, 0, &mut out)?;
    Ok(Value::from(out))
}

fn newline(style: &Style, depth: usize, out: &mut String) {
    if let Some(ind) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(ind);
        }
    }
}

fn string(s: &str, style: &Style, out: &mut String) {
    // serde_json escapes as Python does for `"`, `\` and control characters.
    let quoted = serde_json::to_string(s).unwrap_or_default();
    if !style.ensure_ascii {
        out.push_str(&quoted);
        return;
    }
    for c in quoted.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
}

/// Writes `v` as JSON, maps in their own order (as Python's dicts keep theirs), within the
/// template limits' depth and length (issue 40).
fn write(v: &Value, style: &Style, depth: usize, out: &mut String) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    within("tojson", depth, out)?;
    match v.kind() {
        K::Seq | K::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item);
                }
                newline(style, depth + 1, out);
                write(x, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push(']');
        }
        K::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort_by_key(|k| k.to_string());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item);
                }
                newline(style, depth + 1, out);
                // Python writes every key as a string.
                string(
                    &k.as_str().map_or_else(|| k.to_string(), str::to_owned),
                    style,
                    out,
                );
                out.push_str(&style.key);
                write(&v.get_item(k)?, style, depth + 1, out)?;
            }
            newline(style, depth, out);
            out.push('}');
        }
        K::String => string(v.as_str().unwrap_or(""), style, out),
        K::Undefined | K::None => out.push_str("null"),
        // Numbers and booleans: serde's writing is Python's (`1`, `2.5`, `1.0`, `true`).
        _ => out.push_str(&serde_json::to_string(v).map_err(|e| {
            Error::new(
                minijinja::ErrorKind::InvalidOperation,
                format!("tojson: {e}"),
            )
        })?),
    }
    Ok(())
}

/// Python's `repr` of a value: `{'k': [1, 2.5, True, None]}`, within the template limits'
/// depth and length.
fn repr(v: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    within("printing", depth, out)?;
    match v.kind() {
        K::Seq | K::Iterable => {
            out.push('[');
            for (i, x) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&x, depth + 1, out)?;
            }
            out.push(']');
        }
        K::Map => {
            out.push('{');
            for (i, k) in v.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&k, depth + 1, out)?;
                out.push_str(": ");
                repr(&v.get_item(&k).unwrap_or_default(), depth + 1, out)?;
            }
            out.push('}');
        }
        K::String => repr_str(v.as_str().unwrap_or(""), out),
        K::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        K::Undefined | K::None => out.push_str("None"),
        _ => out.push_str(&serde_json::to_string(v).unwrap_or_else(|_| v.to_string())),
    }
    Ok(())
}

/// Python's `repr` of a string: single quotes unless it holds `'` and no `"`.
fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

fn is_container(v: &Value) -> bool {
    use minijinja::value::ValueKind as K;
    matches!(v.kind(), K::Seq | K::Map)
}

/// Prints values as jinja2 does where minijinja differs: a dict or list as Python's `str()`.
pub fn formatter(
    out: &mut minijinja::Output,
    state: &minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    if is_container(value) {
        let mut text = String::new();
        repr(value, 0, &mut text)?;
        return out.write_str(&text).map_err(Error::from);
    }
    minijinja::escape_formatter(out, state, value)
}

/// `x|string`, as Python's `str(x)`: a string as it is, anything else as Python writes it.
pub fn python_string(value: Value) -> Result<Value, Error> {
    if value.as_str().is_some() {
        return Ok(value);
    }
    use minijinja::value::ValueKind as K;
    if is_container(&value) || matches!(value.kind(), K::Bool | K::None | K::Undefined) {
        return pprint(value);
    }
    Ok(Value::from(value.to_string()))
}

/// `x|pprint`, as Python's `pprint.pformat` for what templates hold (one line): Python's
/// `repr`, bounded as printing is (minijinja's own walks any depth).
pub fn pprint(value: Value) -> Result<Value, Error> {
    let mut text = String::new();
    repr(&value, 0, &mut text)?;
    Ok(Value::from(text))
}

/// The template with `{% generation %}` … `{% endgeneration %}` turned into a block that always
/// renders (`{% if true %}` … `{% endif %}`), keeping any whitespace control (`{%-`, `-%}`).
pub fn generation_as_block(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        // `{%}` is an opening with no tag in it: its `%}` starts after the `{%`.
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let open = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
        let close = inner
            .strip_suffix(['-', '+'])
            .map_or("", |_| &inner[inner.len() - 1..]);
        let word = inner.trim_matches(['-', '+']).trim();
        let replaced = match word {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replaced {
            Some(w) => out.push_str(&format!("{{%{open} {w} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use minijinja::{context, Environment};

    fn render(src: &str) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", super::tojson);
        env.render_str(src, context! {}).unwrap()
    }

    #[test]
    fn generation_tags_become_blocks_that_always_render() {
        assert_eq!(
            super::generation_as_block(
                "a{%- generation %}b{% endgeneration -%} c{{ x }}{% if y %}"
            ),
            "a{%- if true %}b{% endif -%} c{{ x }}{% if y %}"
        );
    }

    #[test]
    fn dicts_and_lists_print_as_pythons_str_writes_them() {
        let mut env = Environment::new();
        env.set_formatter(super::formatter);
        env.add_filter("string", super::python_string);
        let src = r#"{{ {"a": "it's", "b": [1, 2.5, true, none], "c": "q'\"\n"} }}|{{ [1, "x"] | string }}|{{ true | string }}|{{ 3 | string }}"#;
        assert_eq!(
            env.render_str(src, context! {}).unwrap(),
            r#"{'a': "it's", 'b': [1, 2.5, True, None], 'c': 'q\'"\n'}|[1, 'x']|True|3"#
        );
    }

    #[test]
    fn tojson_writes_what_pythons_json_dumps_writes() {
        // Keys in their order, Python's spaces, non-ASCII as it is, nothing escaped for HTML.
        assert_eq!(
            render(
                r#"{{ {"name": "café", "args": [1, 2.5, true, none], "q": "<a href='x'>", "e": {}} | tojson }}"#
            ),
            r#"{"name": "café", "args": [1, 2.5, true, null], "q": "<a href='x'>", "e": {}}"#
        );
        assert_eq!(
            render(r#"{{ {"b": [1], "a": "é"} | tojson(indent=2) }}"#),
            "{\n  \"b\": [\n    1\n  ],\n  \"a\": \"é\"\n}"
        );
        assert_eq!(
            render(
                r#"{{ {"b": 1, "a": "x\ny"} | tojson(separators=(',', ':'), sort_keys=true) }}"#
            ),
            r#"{"a":"x\ny","b":1}"#
        );
        assert_eq!(
            render(r#"{{ "é🦀" | tojson(ensure_ascii=true) }}"#),
            r#""\u00e9\ud83e\udd80""#
        );
    }
}
