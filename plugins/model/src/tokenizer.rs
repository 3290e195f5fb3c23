//! Hugging Face `tokenizer.json` tokenizers, and a character-level one for small tasks.

use std::path::Path;
use std::sync::Arc;

use areal_sdk::{ChatMessage, PluginError, Tokenizer, ToolSchema};
use tokenizers::AddedToken;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::models::bpe::BPE;

use crate::chat::ChatTemplate;

/// Unknown characters of a [`char_tokenizer`].
pub const UNK: &str = "<unk>";
/// End of sequence of a [`char_tokenizer`].
pub const EOS: &str = "<eos>";

/// Tokenizer file of a checkpoint folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Generation defaults of a checkpoint folder (its stop tokens beyond `config.json`'s).
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Files of a Hugging Face checkpoint folder that go with its `tokenizer.json`: the
/// tokenizer's settings and special tokens, the chat template, and the generation settings
/// (the stop tokens beyond `config.json`'s). A tokenizer read from a folder keeps them
/// verbatim and writes them back, so that a saved checkpoint keeps the model's chat format and
/// stop tokens.
pub const TOKENIZER_SIDE_FILES: [&str; 4] = [
    crate::chat::TOKENIZER_CONFIG_FILE,
    "special_tokens_map.json",
    crate::chat::CHAT_TEMPLATE_FILE,
    GENERATION_CONFIG_FILE,
];

/// A Hugging Face tokenizer with the model's stop tokens and, from a checkpoint folder, its
/// chat template.
#[derive(Clone, Debug)]
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    stop: Vec<u32>,
    unk: Option<u32>,
    chat: Option<Arc<ChatTemplate>>,
    // the [`TOKENIZER_SIDE_FILES`] of the folder it was read from: (name, text)
    side_files: Vec<(String, String)>,
}

impl HfTokenizer {
    /// Wrap `inner`; generation stops at `stop`.
    pub fn new(inner: tokenizers::Tokenizer, stop: Vec<u32>) -> Self {
        let unk = inner.token_to_id(UNK);
        Self {
            inner,
            stop,
            unk,
            chat: None,
            side_files: Vec::new(),
        }
    }

    /// The tokenizer of the checkpoint folder `dir`: its `tokenizer.json`, its chat template
    /// (if it has one) and the [`TOKENIZER_SIDE_FILES`] it has; generation stops at `stop`.
    pub fn from_folder(dir: &Path, stop: Vec<u32>) -> Result<Self, PluginError> {
        let mut tokenizer = Self::from_file(&dir.join(TOKENIZER_FILE), stop)?;
        for name in TOKENIZER_SIDE_FILES {
            if let Some(text) = crate::chat::read_side_file(&dir.join(name))? {
                tokenizer.side_files.push((name.to_owned(), text));
            }
        }
        let side = |name: &str| {
            let file = tokenizer.side_files.iter().find(|(n, _)| n == name);
            file.map(|(_, text)| text.as_str())
        };
        let chat = ChatTemplate::from_files(
            dir,
            side(crate::chat::TOKENIZER_CONFIG_FILE),
            side(crate::chat::CHAT_TEMPLATE_FILE),
        )?;
        tokenizer.chat = chat.map(Arc::new);
        Ok(tokenizer)
    }

    /// Write `tokenizer.json` and the [`TOKENIZER_SIDE_FILES`] it was read with into the folder `dir`.
    pub fn save_to_folder(&self, dir: &Path) -> Result<(), PluginError> {
        self.save(&dir.join(TOKENIZER_FILE))?;
        for (name, text) in &self.side_files {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| {
                PluginError::failed(crate::NAME, format!("cannot write {}: {e}", path.display()))
            })?;
        }
        Ok(())
    }

    /// The model's chat template, if its checkpoint has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat.as_deref()
    }

    /// Use the chat template `source` (Jinja) instead of the checkpoint's, with the special
    /// tokens its `tokenizer_config.json` names (a fresh character tokenizer's: `<eos>` and
    /// `<unk>`). A checkpoint saved from it keeps the template as `chat_template.jinja`.
    pub fn set_chat_template(&mut self, source: &str) -> Result<(), PluginError> {
        let config = self
            .side_files
            .iter()
            .find(|(name, _)| name == crate::chat::TOKENIZER_CONFIG_FILE)
            .map(|(_, text)| text.clone());
        let config: serde_json::Value = match config {
            Some(text) => serde_json::from_str(&text).unwrap_or_default(),
            None => {
                // a fresh tokenizer: its settings are written with the template, so that a
                // checkpoint read back names the same tokens
                let config = serde_json::json!({
                    "eos_token": self.inner.id_to_token(self.stop.first().copied().unwrap_or(1)),
                    "unk_token": self.unk.and_then(|id| self.inner.id_to_token(id)),
                });
                self.side_files.push((
                    crate::chat::TOKENIZER_CONFIG_FILE.to_owned(),
                    serde_json::to_string_pretty(&config).expect("JSON") + "\n",
                ));
                config
            }
        };
        let chat = ChatTemplate::new(source, crate::chat::special_tokens(&config))?;
        self.chat = Some(Arc::new(chat));
        self.side_files
            .retain(|(name, _)| name != crate::chat::CHAT_TEMPLATE_FILE);
        self.side_files.push((
            crate::chat::CHAT_TEMPLATE_FILE.to_owned(),
            source.to_owned(),
        ));
        Ok(())
    }

    /// Read `tokenizer.json` (a regular file within [`MAX_JSON_FILE_BYTES`], checked before
    /// it is read).
    ///
    /// [`MAX_JSON_FILE_BYTES`]: areal_sdk::resources::MAX_JSON_FILE_BYTES
    pub fn from_file(path: &Path, stop: Vec<u32>) -> Result<Self, PluginError> {
        let bytes =
            areal_sdk::resources::read_file(path, areal_sdk::resources::MAX_JSON_FILE_BYTES)
                .map_err(|e| {
                    PluginError::failed(
                        crate::NAME,
                        format!("cannot read tokenizer {}: {e}", path.display()),
                    )
                })?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| {
            PluginError::failed(
                crate::NAME,
                format!("cannot read tokenizer {}: {e}", path.display()),
            )
        })?;
        Ok(Self::new(inner, stop))
    }

    /// Write `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), PluginError> {
        self.inner.save(path, true).map_err(|e| {
            PluginError::failed(
                crate::NAME,
                format!("cannot write tokenizer {}: {e}", path.display()),
            )
        })
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The id of `token`, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, PluginError> {
        let encoding = self.inner.encode(text, false).map_err(|e| {
            PluginError::failed(crate::NAME, format!("cannot encode {text:?}: {e}"))
        })?;
        let ids = encoding.get_ids().to_vec();
        if let Some(unk) = self.unk
            && let Some(i) = ids.iter().position(|&id| id == unk)
        {
            let (start, end) = encoding.get_offsets()[i];
            return Err(PluginError::failed(
                crate::NAME,
                format!(
                    "{:?} in {text:?} is not in the vocabulary",
                    &text[start..end]
                ),
            ));
        }
        Ok(ids)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| PluginError::failed(crate::NAME, format!("cannot decode {ids:?}: {e}")))
    }

    fn decode_verbatim(&self, ids: &[u32]) -> Result<String, PluginError> {
        self.inner
            .decode(ids, false)
            .map_err(|e| PluginError::failed(crate::NAME, format!("cannot decode {ids:?}: {e}")))
    }

    fn stop_token_ids(&self) -> Vec<u32> {
        self.stop.clone()
    }

    fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    fn render_chat(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSchema],
        add_generation_prompt: bool,
    ) -> Result<String, PluginError> {
        match &self.chat {
            Some(template) => template.render(messages, tools, add_generation_prompt),
            None => Err(PluginError::failed(
                crate::NAME,
                "the model has no chat template: its checkpoint has neither \
                 chat_template.jinja nor a `chat_template` in tokenizer_config.json",
            )),
        }
    }
}

/// A tokenizer with one token per character of `alphabet` (plus `<unk>` = 0 and `<eos>` = 1),
/// as a Hugging Face BPE model without merges, so it is an ordinary `tokenizer.json`.
pub fn char_tokenizer(alphabet: &str) -> Result<HfTokenizer, PluginError> {
    let mut vocab = tokenizers::models::bpe::Vocab::new();
    vocab.insert(UNK.into(), 0);
    vocab.insert(EOS.into(), 1);
    for c in alphabet.chars() {
        let next = vocab.len() as u32;
        vocab.entry(c.to_string()).or_insert(next);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, Vec::new())
        .unk_token(UNK.into())
        .build()
        .map_err(|e| {
            PluginError::failed(
                crate::NAME,
                format!("cannot build the character tokenizer: {e}"),
            )
        })?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_decoder(Some(Fuse::new()));
    inner.add_special_tokens(&[AddedToken::from(UNK, true), AddedToken::from(EOS, true)]);
    Ok(HfTokenizer::new(inner, vec![1]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_round_trip_through_tokenizer_json() {
        let t = char_tokenizer("0123456789+=, ").unwrap();
        let ids = t.encode("12+9=21").unwrap();
        assert_eq!(ids.len(), 7);
        assert_eq!(t.decode(&ids).unwrap(), "12+9=21");
        let mut with_eos = ids.clone();
        with_eos.push(1);
        assert_eq!(
            t.decode(&with_eos).unwrap(),
            "12+9=21",
            "the stop token is not text"
        );
        assert_eq!(t.vocab_size(), 16);
        let err = t.encode("1x2").unwrap_err().to_string();
        assert!(err.contains("\"x\""), "{err}");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        t.save(&path).unwrap();
        let again = HfTokenizer::from_file(&path, vec![1]).unwrap();
        assert_eq!(again.encode("9 , 0").unwrap(), t.encode("9 , 0").unwrap());
        assert_eq!(again.decode(&ids).unwrap(), "12+9=21");
    }
}
