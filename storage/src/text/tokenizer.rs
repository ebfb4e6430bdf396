//! The tokenizers of the text index: the same words as the log query language's (runs of
//! letters, digits and `_`, lower-cased), and for fields other than the body those words
//! followed by the whole value, lower-cased.

use tantivy::tokenizer::{Token, TokenStream, Tokenizer, TokenizerManager};

/// A tokenizer manager with Weft's tokenizers registered.
pub fn manager() -> TokenizerManager {
    let m = TokenizerManager::default();
    m.register(super::WORDS, Words { whole: false });
    m.register(super::FIELD_WORDS, Words { whole: true });
    m
}

/// The words of a text, lower-cased, as tantivy tokens.
#[derive(Clone, Copy)]
pub struct Words {
    /// Also the whole text, lower-cased, after the words (when it is not one of them).
    whole: bool,
}

pub struct WordStream {
    tokens: Vec<Token>,
    at: usize,
}

/// The words of a text as the log query language cuts them (runs of letters, digits and `_`),
/// each with its byte offset.
pub fn words(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(move |w| (w.as_ptr() as usize - text.as_ptr() as usize, w))
}

/// The tokens of a text (what [`Words`] yields): its [`words`], lower-cased, and with `whole`
/// the whole text lower-cased after them when it is not one of them.
pub fn tokens(text: &str, whole: bool) -> Vec<Token> {
    let mut out: Vec<Token> = words(text)
        .enumerate()
        .map(|(position, (from, w))| Token {
            offset_from: from,
            offset_to: from + w.len(),
            position,
            text: w.to_lowercase(),
            position_length: 1,
        })
        .collect();
    if whole && !text.is_empty() {
        let lower = text.to_lowercase();
        if !out.iter().any(|t| t.text == lower) {
            let position = out.len();
            out.push(Token {
                offset_from: 0,
                offset_to: text.len(),
                position,
                text: lower,
                position_length: 1,
            });
        }
    }
    out
}

impl Tokenizer for Words {
    type TokenStream<'a> = WordStream;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> WordStream {
        WordStream {
            tokens: tokens(text, self.whole),
            at: 0,
        }
    }
}

impl TokenStream for WordStream {
    fn advance(&mut self) -> bool {
        if self.at < self.tokens.len() {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn token(&self) -> &Token {
        &self.tokens[self.at - 1]
    }

    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.at - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_cut_as_the_query_language_cuts_them() {
        let t: Vec<String> = tokens("Refund: charged TWICE, user_id=42 café", false)
            .into_iter()
            .map(|t| t.text)
            .collect();
        assert_eq!(t, ["refund", "charged", "twice", "user_id", "42", "café"]);
        let t: Vec<String> = tokens("prompt_input", true)
            .into_iter()
            .map(|t| t.text)
            .collect();
        assert_eq!(t, ["prompt_input"]);
        let t: Vec<String> = tokens("Llama-3.1-8B", true)
            .into_iter()
            .map(|t| t.text)
            .collect();
        assert_eq!(t, ["llama", "3", "1", "8b", "llama-3.1-8b"]);
    }
}
