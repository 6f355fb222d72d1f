//! JSON Schema to GBNF, as llama.cpp's `json_schema_to_grammar` does: the
//! output is compact JSON with optional whitespace between tokens, object
//! properties in the schema's order (required ones first, then any subset of
//! the optional ones in order), and no properties the schema does not name.
//! Supported: `type` (one or a list), `properties`, `required`,
//! `additionalProperties` (false, or a schema/true on an object without
//! `properties`), `items`, `prefixItems`, `minItems`, `maxItems`, `enum`,
//! `const`, `anyOf`, `oneOf`, `$ref` to `#/definitions/..` or `#/$defs/..`,
//! `minLength`, `maxLength` and `pattern` (anchored, a regex subset) on
//! strings. Anything else is an error naming the keyword.

use crate::error::{Error, Result};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Keywords that say nothing about which values are valid.
const ANNOTATIONS: &[&str] = &[
    "description",
    "title",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "definitions",
    "$defs",
    "deprecated",
    "readOnly",
    "writeOnly",
];

const SPACE: &str = r#"space ::= | " " | "\n"{1,2} [ \t]{0,20}"#;

const PRIMITIVES: &[(&str, &str)] = &[
    ("boolean", r#"boolean ::= ("true" | "false") space"#),
    ("null", r#"null ::= "null" space"#),
    (
        "char",
        r#"char ::= [^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" [0-9a-fA-F]{4})"#,
    ),
    (
        "integral-part",
        r#"integral-part ::= [0] | [1-9] [0-9]{0,15}"#,
    ),
    ("decimal-part", r#"decimal-part ::= [0-9]{1,16}"#),
    (
        "number",
        r#"number ::= ("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space"#,
    ),
    ("integer", r#"integer ::= ("-"? integral-part) space"#),
    ("string", r#"string ::= "\"" char* "\"" space"#),
    (
        "value",
        r#"value ::= object | array | string | number | boolean | null"#,
    ),
    (
        "object",
        r#"object ::= "{" space ( string ":" space value ("," space string ":" space value)* )? "}" space"#,
    ),
    (
        "array",
        r#"array ::= "[" space ( value ("," space value)* )? "]" space"#,
    ),
];

/// Primitives each primitive uses.
fn primitive_deps(name: &str) -> &'static [&'static str] {
    match name {
        "number" | "integer" => &["integral-part", "decimal-part"],
        "string" => &["char"],
        // Each of the three refers to the other two.
        "value" | "object" | "array" => &[
            "value",
            "object",
            "array",
            "string",
            "number",
            "boolean",
            "null",
            "char",
            "integral-part",
            "decimal-part",
        ],
        _ => &[],
    }
}

struct Converter<'a> {
    root: &'a Value,
    rules: Vec<(String, String)>,
    names: HashMap<String, usize>,
    primitives: Vec<&'static str>,
    /// `$ref` targets already given a rule (or being built).
    refs: HashMap<String, String>,
}

/// The GBNF grammar for values valid against `schema`; `what` names the
/// schema in errors.
pub fn to_gbnf(schema: &Value, what: &str) -> Result<String> {
    let mut c = Converter {
        root: schema,
        rules: Vec::new(),
        names: HashMap::new(),
        primitives: Vec::new(),
        refs: HashMap::new(),
    };
    let body = c
        .visit(schema, "#")
        .map_err(|e| Error::invalid(format!("{what}: {e}")))?;
    let mut out = format!("root ::= {body}\n{SPACE}\n");
    let mut prims: Vec<&str> = Vec::new();
    for p in &c.primitives {
        for q in std::iter::once(*p).chain(primitive_deps(p).iter().copied()) {
            if !prims.contains(&q) {
                prims.push(q);
            }
        }
    }
    for (name, rule) in PRIMITIVES {
        if prims.contains(name) {
            out.push_str(rule);
            out.push('\n');
        }
    }
    for (name, body) in &c.rules {
        out.push_str(&format!("{name} ::= {body}\n"));
    }
    Ok(out)
}

/// A GBNF string literal for `s`.
fn literal(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                out.push_str(&format!("\\x{:02X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON value as a GBNF literal (compact), then optional space.
fn json_literal(v: &Value) -> String {
    format!("{} space", literal(&v.to_string()))
}

fn rule_name(path: &str) -> String {
    let mut s: String = path
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    let s = s.trim_matches('-');
    if s.is_empty() {
        "item".into()
    } else {
        s.to_string()
    }
}

fn count(v: Option<&Value>, key: &str, path: &str) -> std::result::Result<Option<u64>, String> {
    match v {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} at {path} is not a non-negative integer")),
    }
}

impl Converter<'_> {
    fn primitive(&mut self, name: &'static str) -> String {
        if !self.primitives.contains(&name) {
            self.primitives.push(name);
        }
        name.to_string()
    }

    /// Adds a rule named after `path` (unique), returns its name.
    fn add_rule(&mut self, path: &str, body: String) -> String {
        let base = format!("s-{}", rule_name(path));
        let n = self.names.entry(base.clone()).or_insert(0);
        *n += 1;
        let name = if *n == 1 { base } else { format!("{base}-{n}") };
        self.rules.push((name.clone(), body));
        name
    }

    /// A GBNF expression for values valid against `schema` at `path`.
    fn visit(&mut self, schema: &Value, path: &str) -> std::result::Result<String, String> {
        let obj = match schema {
            Value::Bool(true) => return Ok(self.primitive("value")),
            Value::Bool(false) => return Err(format!("schema false at {path} allows nothing")),
            Value::Object(o) => o,
            _ => return Err(format!("the schema at {path} is not an object")),
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, path);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = obj.get(key) {
                let alts = alts
                    .as_array()
                    .filter(|a| !a.is_empty())
                    .ok_or_else(|| format!("{key} at {path} is not a non-empty array"))?;
                let mut parts = Vec::new();
                for (i, a) in alts.iter().enumerate() {
                    let p = format!("{path}/{key}/{i}");
                    let body = self.visit(a, &p)?;
                    parts.push(self.add_rule(&p, body));
                }
                return Ok(format!("({})", parts.join(" | ")));
            }
        }
        if let Some(v) = obj.get("const") {
            return Ok(json_literal(v));
        }
        if let Some(values) = obj.get("enum") {
            let values = values
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| format!("enum at {path} is not a non-empty array"))?;
            let parts: Vec<String> = values.iter().map(json_literal).collect();
            return Ok(format!("({})", parts.join(" | ")));
        }
        for key in obj.keys() {
            let known = ANNOTATIONS.contains(&key.as_str())
                || matches!(
                    key.as_str(),
                    "type"
                        | "properties"
                        | "required"
                        | "additionalProperties"
                        | "items"
                        | "prefixItems"
                        | "minItems"
                        | "maxItems"
                        | "minLength"
                        | "maxLength"
                        | "pattern"
                );
            if !known {
                return Err(format!("unsupported JSON Schema keyword {key} at {path}"));
            }
        }
        let types: Vec<&str> = match obj.get("type") {
            None => {
                if obj.contains_key("properties") || obj.contains_key("additionalProperties") {
                    vec!["object"]
                } else if obj.contains_key("items") || obj.contains_key("prefixItems") {
                    vec!["array"]
                } else if obj.contains_key("pattern")
                    || obj.contains_key("minLength")
                    || obj.contains_key("maxLength")
                {
                    vec!["string"]
                } else {
                    return Ok(self.primitive("value"));
                }
            }
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts
                .iter()
                .map(|t| {
                    t.as_str()
                        .ok_or_else(|| format!("type at {path} is not a string"))
                })
                .collect::<std::result::Result<_, _>>()?,
            Some(_) => return Err(format!("type at {path} is not a string or a list")),
        };
        let mut parts = Vec::new();
        for t in &types {
            parts.push(match *t {
                "string" => self.string(obj, path)?,
                "number" => self.primitive("number"),
                "integer" => self.primitive("integer"),
                "boolean" => self.primitive("boolean"),
                "null" => self.primitive("null"),
                "object" => self.object(obj, path)?,
                "array" => self.array(obj, path)?,
                other => return Err(format!("unknown type {other:?} at {path}")),
            });
        }
        Ok(if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            format!("({})", parts.join(" | "))
        })
    }

    fn reference(&mut self, r: &Value, path: &str) -> std::result::Result<String, String> {
        let r = r
            .as_str()
            .ok_or_else(|| format!("$ref at {path} is not a string"))?;
        if let Some(name) = self.refs.get(r) {
            return Ok(name.clone());
        }
        let Some(pointer) = r
            .strip_prefix('#')
            .filter(|p| p.starts_with("/definitions/") || p.starts_with("/$defs/"))
        else {
            return Err(format!(
                "$ref {r} at {path}: only #/definitions/.. and #/$defs/.. are supported"
            ));
        };
        let target = self
            .root
            .pointer(pointer)
            .ok_or_else(|| format!("$ref {r} at {path} points at nothing"))?;
        // Name the rule first, so a recursive reference finds it.
        let name = format!("ref-{}", rule_name(pointer));
        self.refs.insert(r.to_string(), name.clone());
        let body = self.visit(target, r)?;
        self.rules.push((name.clone(), body));
        Ok(name)
    }

    fn string(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
    ) -> std::result::Result<String, String> {
        if let Some(p) = obj.get("pattern") {
            let p = p
                .as_str()
                .ok_or_else(|| format!("pattern at {path} is not a string"))?;
            if obj.contains_key("minLength") || obj.contains_key("maxLength") {
                return Err(format!(
                    "pattern together with minLength/maxLength at {path}"
                ));
            }
            let body = regex_to_gbnf(p).map_err(|e| format!("pattern at {path}: {e}"))?;
            return Ok(format!("\"\\\"\" {body} \"\\\"\" space"));
        }
        let min = count(obj.get("minLength"), "minLength", path)?;
        let max = count(obj.get("maxLength"), "maxLength", path)?;
        if min.is_none() && max.is_none() {
            return Ok(self.primitive("string"));
        }
        self.primitive("char");
        let min = min.unwrap_or(0);
        let rep = match max {
            Some(max) if max < min => {
                return Err(format!("maxLength < minLength at {path}"));
            }
            Some(max) => format!("{{{min},{max}}}"),
            None => format!("{{{min},}}"),
        };
        Ok(format!("\"\\\"\" char{rep} \"\\\"\" space"))
    }

    fn object(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
    ) -> std::result::Result<String, String> {
        let empty = Map::new();
        let props = match obj.get("properties") {
            None => &empty,
            Some(Value::Object(p)) => p,
            Some(_) => return Err(format!("properties at {path} is not an object")),
        };
        let additional = obj.get("additionalProperties");
        if props.is_empty() && !obj.contains_key("required") {
            match additional {
                Some(Value::Bool(false)) => return Ok(r#""{" space "}" space"#.into()),
                None | Some(Value::Bool(true)) => return Ok(self.primitive("object")),
                Some(schema) => {
                    let p = format!("{path}/additionalProperties");
                    let v = self.visit(schema, &p)?;
                    let v = self.add_rule(&p, v);
                    let s = self.primitive("string");
                    return Ok(format!(
                        r#""{{" space ( {s} ":" space {v} ("," space {s} ":" space {v})* )? "}}" space"#
                    ));
                }
            }
        }
        if !matches!(additional, None | Some(Value::Bool(false))) {
            return Err(format!(
                "unsupported JSON Schema keyword additionalProperties (with properties) at {path}"
            ));
        }
        let required: Vec<&str> = match obj.get("required") {
            None => Vec::new(),
            Some(Value::Array(r)) => r
                .iter()
                .map(|v| {
                    v.as_str()
                        .ok_or_else(|| format!("required at {path} lists a non-string"))
                })
                .collect::<std::result::Result<_, _>>()?,
            Some(_) => return Err(format!("required at {path} is not an array")),
        };
        let kv = |c: &mut Self, name: &str| -> std::result::Result<String, String> {
            let p = format!("{path}/properties/{name}");
            let value = match props.get(name) {
                Some(s) => c.visit(s, &p)?,
                None => c.primitive("value"),
            };
            let body = format!(
                "{} space \":\" space {value}",
                literal(&Value::String(name.to_string()).to_string())
            );
            Ok(c.add_rule(&format!("{p}-kv"), body))
        };
        let mut req_names: Vec<&str> = props
            .keys()
            .map(String::as_str)
            .filter(|k| required.contains(k))
            .collect();
        for r in &required {
            if !req_names.contains(r) {
                req_names.push(r);
            }
        }
        let opt_names: Vec<&str> = props
            .keys()
            .map(String::as_str)
            .filter(|k| !required.contains(k))
            .collect();
        let mut req = Vec::new();
        for name in &req_names {
            req.push(kv(self, name)?);
        }
        let mut opt = Vec::new();
        for name in &opt_names {
            opt.push(kv(self, name)?);
        }
        // tails[i]: any in-order, non-empty subset of opt[i..].
        let mut tail: Option<String> = None;
        for (i, o) in opt.iter().enumerate().rev() {
            let body = match &tail {
                None => o.clone(),
                Some(t) => format!("{o} ( \",\" space {t} )? | {t}"),
            };
            tail = Some(self.add_rule(&format!("{path}-rest-{i}"), body));
        }
        let mut body = String::from(r#""{" space "#);
        body.push_str(&req.join(r#" "," space "#));
        match (&tail, req.is_empty()) {
            (Some(t), true) => body.push_str(&format!("( {t} )? ")),
            (Some(t), false) => body.push_str(&format!(" ( \",\" space {t} )? ")),
            (None, _) => body.push(' '),
        }
        body.push_str(r#""}" space"#);
        Ok(body)
    }

    fn array(
        &mut self,
        obj: &Map<String, Value>,
        path: &str,
    ) -> std::result::Result<String, String> {
        if let Some(prefix) = obj.get("prefixItems") {
            let prefix = prefix
                .as_array()
                .ok_or_else(|| format!("prefixItems at {path} is not an array"))?;
            if obj.contains_key("items") && obj.get("items") != Some(&Value::Bool(false)) {
                return Err(format!("items after prefixItems at {path} is unsupported"));
            }
            let mut parts = Vec::new();
            for (i, s) in prefix.iter().enumerate() {
                let p = format!("{path}/prefixItems/{i}");
                let b = self.visit(s, &p)?;
                parts.push(self.add_rule(&p, b));
            }
            return Ok(format!(
                r#""[" space {} "]" space"#,
                parts.join(r#" "," space "#)
            ));
        }
        let item = match obj.get("items") {
            None => self.primitive("value"),
            Some(s) => {
                let p = format!("{path}/items");
                let b = self.visit(s, &p)?;
                self.add_rule(&p, b)
            }
        };
        let min = count(obj.get("minItems"), "minItems", path)?.unwrap_or(0);
        let max = count(obj.get("maxItems"), "maxItems", path)?;
        if max.is_some_and(|m| m < min) {
            return Err(format!("maxItems < minItems at {path}"));
        }
        if max == Some(0) {
            return Ok(r#""[" space "]" space"#.into());
        }
        let more = match max {
            None => format!("{{{},}}", min.saturating_sub(1)),
            Some(m) => format!("{{{},{}}}", min.saturating_sub(1), m - 1),
        };
        let inner = format!(r#"{item} ( "," space {item} ){more}"#);
        Ok(if min == 0 {
            format!(r#""[" space ( {inner} )? "]" space"#)
        } else {
            format!(r#""[" space {inner} "]" space"#)
        })
    }
}

/// An anchored regular expression (`^...$`) as a GBNF expression over the
/// characters of a JSON string: literals, `.`, classes, `\d \w \s`, groups
/// (`(...)`, `(?:...)`), `|` and the quantifiers `* + ? {m} {m,} {m,n}`.
pub fn regex_to_gbnf(pattern: &str) -> std::result::Result<String, String> {
    let inner = pattern
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .ok_or("must start with ^ and end with $")?;
    let chars: Vec<char> = inner.chars().collect();
    let mut pos = 0;
    let out = regex_alternatives(&chars, &mut pos)?;
    if pos < chars.len() {
        return Err(format!("unexpected {:?}", chars[pos]));
    }
    Ok(format!("({out})"))
}

/// A character as it may appear inside a GBNF class.
fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' | '"' => format!("\\{c}"),
        c if (c as u32) < 0x20 => format!("\\x{:02X}", c as u32),
        c => c.to_string(),
    }
}

fn regex_alternatives(c: &[char], pos: &mut usize) -> std::result::Result<String, String> {
    let mut alts = vec![regex_sequence(c, pos)?];
    while c.get(*pos) == Some(&'|') {
        *pos += 1;
        alts.push(regex_sequence(c, pos)?);
    }
    Ok(alts.join(" | "))
}

fn regex_sequence(c: &[char], pos: &mut usize) -> std::result::Result<String, String> {
    // JSON-string characters: no unescaped quote, backslash or control.
    const DOT: &str = r#"[^"\\\x00-\x1F\x7F]"#;
    let mut items: Vec<String> = Vec::new();
    while let Some(&ch) = c.get(*pos) {
        let atom = match ch {
            '|' | ')' => break,
            '(' => {
                *pos += 1;
                if c.get(*pos) == Some(&'?') {
                    if c.get(*pos + 1) != Some(&':') {
                        return Err("only (?:...) groups are supported".into());
                    }
                    *pos += 2;
                }
                let inner = regex_alternatives(c, pos)?;
                if c.get(*pos) != Some(&')') {
                    return Err("unclosed (".into());
                }
                *pos += 1;
                format!("({inner})")
            }
            '.' => {
                *pos += 1;
                DOT.to_string()
            }
            '[' => {
                *pos += 1;
                let mut class = String::from("[");
                if c.get(*pos) == Some(&'^') {
                    class.push('^');
                    *pos += 1;
                }
                loop {
                    match c.get(*pos) {
                        None => return Err("unclosed [".into()),
                        Some(']') => break,
                        Some('\\') => {
                            let e = *c.get(*pos + 1).ok_or("trailing \\")?;
                            *pos += 2;
                            class.push_str(match e {
                                'd' => "0-9",
                                'w' => "a-zA-Z0-9_",
                                's' => " \\t",
                                _ => {
                                    class.push_str(&class_char(e));
                                    continue;
                                }
                            });
                        }
                        Some('-') if class.len() > 1 && c.get(*pos + 1) != Some(&']') => {
                            class.push('-');
                            *pos += 1;
                        }
                        Some(&x) => {
                            class.push_str(&class_char(x));
                            *pos += 1;
                        }
                    }
                }
                *pos += 1;
                class.push(']');
                class
            }
            '\\' => {
                let e = *c.get(*pos + 1).ok_or("trailing \\")?;
                *pos += 2;
                match e {
                    'd' => "[0-9]".into(),
                    'w' => "[a-zA-Z0-9_]".into(),
                    's' => "[ \\t]".into(),
                    'D' | 'W' | 'S' | 'b' | 'B' => return Err(format!("\\{e} is unsupported")),
                    e => format!("[{}]", class_char(e)),
                }
            }
            '*' | '+' | '?' | '{' => return Err(format!("nothing to repeat before {ch:?}")),
            '^' | '$' => return Err("^ and $ only at the ends".into()),
            x => {
                *pos += 1;
                format!("[{}]", class_char(x))
            }
        };
        let quant = match c.get(*pos) {
            Some('*') => Some("*".to_string()),
            Some('+') => Some("+".to_string()),
            Some('?') => Some("?".to_string()),
            Some('{') => {
                let end = c[*pos..]
                    .iter()
                    .position(|&x| x == '}')
                    .ok_or("unclosed {")?;
                let body: String = c[*pos + 1..*pos + end].iter().collect();
                if body.is_empty() || !body.chars().all(|x| x.is_ascii_digit() || x == ',') {
                    return Err(format!("bad repetition {{{body}}}"));
                }
                *pos += end;
                Some(format!("{{{body}}}"))
            }
            _ => None,
        };
        items.push(match quant {
            Some(q) => {
                *pos += 1;
                if c.get(*pos) == Some(&'?') {
                    return Err("lazy quantifiers are unsupported".into());
                }
                format!("{atom}{q}")
            }
            None => atom,
        });
    }
    Ok(if items.is_empty() {
        "\"\"".into()
    } else {
        items.join(" ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Grammar;
    use serde_json::json;

    fn grammar(schema: Value) -> Grammar {
        let text = to_gbnf(&schema, "schema.json").unwrap();
        Grammar::parse(&text, "schema.json").unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn any_object_or_array_takes_any_json_inside() {
        // {"type": "object"} is what response_format json_object asks for.
        let g = grammar(json!({"type": "object"}));
        for ok in [r#"{}"#, r#"{"a": [1, {"b": null}], "c": "d"}"#] {
            assert!(g.matches(ok), "{ok}");
        }
        for bad in [r#"[]"#, r#"{"a"}"#, "1"] {
            assert!(!g.matches(bad), "{bad}");
        }
        let g = grammar(json!({"type": "array"}));
        assert!(g.matches(r#"[1, "x", {"y": [true]}]"#));
        assert!(!g.matches(r#"{}"#));
    }

    #[test]
    fn objects_with_required_and_optional_properties() {
        let g = grammar(json!({
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "b": {"type": "string", "maxLength": 3},
                "c": {"enum": ["x", 1, null]},
                "d": {"type": "boolean"}
            },
            "required": ["b"]
        }));
        for ok in [
            r#"{"b":"ab"}"#,
            r#"{ "b": "", "a": -12, "d": true }"#,
            r#"{"b":"abc","c":"x"}"#,
            r#"{"b":"abc","a":1,"c":null,"d":false}"#,
        ] {
            assert!(g.matches(ok), "{ok}");
        }
        for bad in [
            r#"{}"#,
            r#"{"a":1}"#,
            r#"{"b":"abcd"}"#,
            r#"{"b":"a","c":2}"#,
            r#"{"b":"a","e":1}"#,
            r#"{"b":"a","d":true,"a":1}"#,
            r#"{"b":"a",}"#,
        ] {
            assert!(!g.matches(bad), "{bad}");
        }
    }

    #[test]
    fn arrays_refs_and_patterns() {
        let g = grammar(json!({
            "$defs": {"point": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 3}},
            "type": "object",
            "properties": {
                "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
                "id": {"type": "string", "pattern": "^[A-Z]{2}-\\d+$"},
                "tag": {"const": "v1"}
            },
            "required": ["points", "id"]
        }));
        assert!(g.matches(r#"{"points":[[1,2],[0.5,-3e2,4]],"id":"AB-12"}"#));
        assert!(g.matches(r#"{"points":[],"id":"ZZ-0","tag":"v1"}"#));
        assert!(!g.matches(r#"{"points":[[1]],"id":"AB-12"}"#));
        assert!(!g.matches(r#"{"points":[[1,2,3,4]],"id":"AB-12"}"#));
        assert!(!g.matches(r#"{"points":[],"id":"A-12"}"#));
        assert!(!g.matches(r#"{"points":[],"id":"AB-12","tag":"v2"}"#));
    }

    #[test]
    fn unsupported_keywords_are_named() {
        let e = to_gbnf(&json!({"type": "integer", "minimum": 3}), "s.json").unwrap_err();
        assert_eq!(
            e.to_string(),
            "s.json: unsupported JSON Schema keyword minimum at #"
        );
        let e = to_gbnf(&json!({"$ref": "other.json#/x"}), "s.json").unwrap_err();
        assert!(e.to_string().contains("only #/definitions/"), "{e}");
    }
}
