//! A tiny line preprocessor for WGSL: `#if NAME`, `#if !NAME`, `#else`,
//! `#endif`, nestable. Variants are chosen by defines, never by substring
//! replacement in the source.

pub fn preprocess(source: &str, defines: &[&str]) -> Result<String, String> {
    let mut out = String::with_capacity(source.len());
    // Each entry: (this branch active, any enclosing branch inactive).
    let mut stack: Vec<(bool, bool)> = Vec::new();
    let active = |stack: &[(bool, bool)]| stack.iter().all(|&(on, _)| on);
    for (n, line) in source.lines().enumerate() {
        let t = line.trim_start();
        if let Some(cond) = t.strip_prefix("#if ") {
            let cond = cond.trim();
            let (neg, name) = match cond.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, cond),
            };
            let on = defines.contains(&name) != neg;
            stack.push((on, false));
        } else if t.starts_with("#else") {
            let top = stack
                .last_mut()
                .ok_or(format!("line {}: #else without #if", n + 1))?;
            if top.1 {
                return Err(format!("line {}: second #else", n + 1));
            }
            *top = (!top.0, true);
        } else if t.starts_with("#endif") {
            stack
                .pop()
                .ok_or(format!("line {}: #endif without #if", n + 1))?;
        } else if t.starts_with('#') {
            return Err(format!("line {}: unknown directive {t}", n + 1));
        } else if active(&stack) {
            out.push_str(line);
        }
        out.push('\n');
    }
    if !stack.is_empty() {
        return Err("unterminated #if".into());
    }
    Ok(out)
}

/// The WGSL `enable` directives a variant's features need; they must open
/// the module, before any file of a multi-file kernel.
pub fn enable_directives(v: &super::Variant) -> String {
    let mut s = String::new();
    if v.defines.contains(&"F16") {
        s += "enable f16;\n";
    }
    if v.defines.contains(&"COOP") {
        s += "enable wgpu_cooperative_matrix;\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::preprocess;

    #[test]
    fn branches_and_nesting() {
        let src = "a\n#if X\nb\n#if !Y\nc\n#else\nd\n#endif\n#else\ne\n#endif\nf";
        let keep = |d: &[&str]| {
            preprocess(src, d)
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join("")
        };
        assert_eq!(keep(&[]), "aef");
        assert_eq!(keep(&["X"]), "abcf");
        assert_eq!(keep(&["X", "Y"]), "abdf");
    }

    #[test]
    fn errors() {
        assert!(preprocess("#if X\n", &[]).is_err());
        assert!(preprocess("#endif\n", &[]).is_err());
        assert!(preprocess("#define X\n", &[]).is_err());
    }
}
