//! Chat templates: the Jinja template a model ships (HF `tokenizer_config.json`
//! / `chat_template.jinja`, or GGUF `tokenizer.chat_template`), rendered with
//! minijinja plus Python-compatible string methods, as transformers'
//! `apply_chat_template` does.

use crate::error::{Error, Result};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> ChatTemplate {
        ChatTemplate {
            source: source.to_string(),
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        }
    }

    /// Renders `messages`, ending with the assistant's turn opener when
    /// `add_generation_prompt` is set.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut env = minijinja::Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // HF templates keep the text's own trailing newline and whitespace.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(
                    minijinja::ErrorKind::InvalidOperation,
                    msg,
                ))
            },
        );
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_template("chat", &self.source)
            .map_err(|e| Error::invalid(format!("chat template: {e}")))?;
        let tmpl = env.get_template("chat").expect("template was just added");
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| Error::invalid(format!("chat template: {e}")))
    }
}

/// Today's date in the few `strftime` forms chat templates use (%d, %m, %Y,
/// %b, %B), in UTC.
fn strftime_now(fmt: &str) -> String {
    let (y, m, d) = crate::util::date::today();
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let name = MONTHS[(m - 1) as usize];
    fmt.replace("%d", &format!("{d:02}"))
        .replace("%m", &format!("{m:02}"))
        .replace("%Y", &y.to_string())
        .replace("%B", name)
        .replace("%b", &name[..3])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml() {
        let t = ChatTemplate::new(CHATML, None, None);
        let out = t.render(&[Message::new("user", "Hi")], true).unwrap();
        assert_eq!(out, "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn python_string_methods_and_exceptions() {
        let t = ChatTemplate::new(
            "{{ messages[0]['content'].strip().upper() }}{{ bos_token }}",
            Some("<s>"),
            None,
        );
        assert_eq!(
            t.render(&[Message::new("user", "  hi ")], false).unwrap(),
            "HI<s>"
        );
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", None, None);
        assert!(t
            .render(&[], false)
            .unwrap_err()
            .to_string()
            .contains("no system role"));
    }
}
