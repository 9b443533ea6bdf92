//! What a chat template does with a system message, read by rendering one (under the template
//! limits), as llama.cpp reads a template's capabilities (`common/jinja/caps.cpp`: a template
//! supports the system role when rendering `[system, user]` uses the system message's text).
//! A template that refuses one (Gemma 2's `raise_exception('System role not supported')`) or
//! drops it gets the system text folded into the next message ([`fold_system`]), as llama.cpp's
//! chat code does (`common/chat.cpp`, `system_message_not_supported`), so a system prompt
//! works with every model.

use std::borrow::Cow;

use super::{ChatTemplate, Message, Role};

/// The text the probe's system message carries.
const PROBE: &str = "System message";

impl ChatTemplate {
    /// Whether the template renders a system message: `[system, user]` renders, with the
    /// system text in it. Read once, then kept.
    pub fn system_role(&self) -> bool {
        *self.system_role.get_or_init(|| {
            let probe = [Message::system(PROBE), Message::user("User message")];
            self.render(&probe, true)
                .is_ok_and(|text| text.contains(PROBE))
        })
    }
}

/// `messages` as a template without a system role takes them: a first system message joined
/// to the next message's text with a newline, or dropped when nothing follows it.
pub fn fold_system(messages: &[Message]) -> Cow<'_, [Message]> {
    match messages {
        [first, next, rest @ ..] if first.role == Role::System => {
            let mut joined = next.clone();
            joined.content = format!("{}\n{}", first.content, next.content);
            Cow::Owned(
                std::iter::once(joined)
                    .chain(rest.iter().cloned())
                    .collect(),
            )
        }
        [first] if first.role == Role::System => Cow::Owned(Vec::new()),
        _ => Cow::Borrowed(messages),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 2's refusal, as its template (llama.cpp's `google-gemma-2-2b-it.jinja`) opens.
    const REFUSES: &str = "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}";

    #[test]
    fn a_template_that_refuses_or_drops_a_system_message_has_no_system_role() {
        let chatml = ChatTemplate::new(None, "", "").unwrap();
        assert!(chatml.system_role());
        let refuses = ChatTemplate::new(Some(REFUSES), "<s>", "").unwrap();
        assert!(!refuses.system_role());
        let drops = "{% for m in messages %}{% if m['role'] != 'system' %}{{ m['content'] }}{% endif %}{% endfor %}";
        assert!(!ChatTemplate::new(Some(drops), "", "")
            .unwrap()
            .system_role());
    }

    #[test]
    fn the_system_text_goes_into_the_next_message() {
        let all = [
            Message::system("Be brief."),
            Message::user("Hi"),
            Message::assistant("Hello."),
        ];
        let folded = fold_system(&all);
        assert_eq!(folded.len(), 2);
        assert_eq!(folded[0].role, Role::User);
        assert_eq!(folded[0].content, "Be brief.\nHi");
        assert_eq!(folded[1], all[2]);
        let refuses = ChatTemplate::new(Some(REFUSES), "<s>", "").unwrap();
        assert!(refuses.render(&all, false).is_err());
        assert_eq!(
            refuses.render(&folded, false).unwrap(),
            "<s><user>Be brief.\nHi<assistant>Hello."
        );
        // Alone, it is dropped; without one, nothing changes.
        assert!(fold_system(&all[..1]).is_empty());
        assert!(matches!(fold_system(&all[1..]), Cow::Borrowed(_)));
    }
}
