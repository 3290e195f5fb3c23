//! A character tokenizer over a small alphabet.

use areal_sdk::{PluginConfig, PluginError, Tokenizer};

/// Letters `a`, `b`, ... map to ids 0, 1, ...; the id after the last letter is the stop token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LetterTokenizer {
    letters: u32,
}

impl LetterTokenizer {
    /// A tokenizer over the first `letters` letters of the alphabet (at most 26).
    pub fn new(letters: u32) -> Self {
        assert!(
            (2..=26).contains(&letters),
            "alphabet of {letters} letters is not in 2..=26"
        );
        Self { letters }
    }

    /// Check a `letters` option of plugin section `config`.
    pub(crate) fn check_letters(config: &PluginConfig, letters: u32) -> Result<(), PluginError> {
        if (2..=26).contains(&letters) {
            Ok(())
        } else {
            Err(config.invalid("letters", format!("must be in 2..=26, found {letters}")))
        }
    }

    /// Number of letters.
    pub fn letters(&self) -> u32 {
        self.letters
    }

    /// The stop token id.
    pub fn eos(&self) -> u32 {
        self.letters
    }
}

impl Tokenizer for LetterTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, PluginError> {
        text.chars()
            .map(|c| {
                let id = (c as u32).wrapping_sub('a' as u32);
                if id < self.letters {
                    Ok(id)
                } else {
                    Err(PluginError::failed(
                        "testkit-letters",
                        format!("character {c:?} is not one of the {} letters", self.letters),
                    ))
                }
            })
            .collect()
    }

    fn decode(&self, ids: &[u32]) -> Result<String, PluginError> {
        ids.iter()
            .filter(|&&id| id != self.eos())
            .map(|&id| {
                char::from_u32('a' as u32 + id)
                    .filter(|_| id < self.letters)
                    .ok_or_else(|| {
                        PluginError::failed(
                            "testkit-letters",
                            format!("token id {id} out of range"),
                        )
                    })
            })
            .collect()
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        vec![self.eos()]
    }

    fn vocab_size(&self) -> usize {
        self.letters as usize + 1
    }
}
