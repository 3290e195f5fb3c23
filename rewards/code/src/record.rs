//! LiveCodeBench records: tests (public, private, compressed private) and the code to grade.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A record could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct RecordError {
    /// The offending field.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn bad(field: &str, message: impl Into<String>) -> RecordError {
    RecordError {
        field: field.to_owned(),
        message: message.into(),
    }
}

/// How a test feeds the program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TestKind {
    /// Input on stdin, output compared from stdout.
    Stdin,
    /// Each input line is one JSON argument of `func_name`; the return value is compared.
    Functional,
}

/// One test: input and expected output, as LiveCodeBench stores them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestCase {
    /// The program's input (stdin text, or one JSON argument per line).
    pub input: String,
    /// The expected output (stdout text, or the JSON of the return value).
    pub output: String,
    /// `stdin` or `functional`.
    #[serde(rename = "testtype")]
    pub kind: TestKind,
}

/// What grading needs from a LiveCodeBench record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// `question_id`, when the record has one.
    pub id: Option<String>,
    /// Public tests, then private ones (LiveCodeBench grades on both).
    pub tests: Vec<TestCase>,
    /// `metadata.func_name` for call-based problems.
    pub func_name: Option<String>,
}

/// The most bytes a record's tests may take, by default (256 MiB), in each of its two test
/// fields: decompressed, or as written where they are not compressed. Real LiveCodeBench
/// records stay far below it; a zlib bomb stops here instead of filling memory.
pub const DEFAULT_MAX_TESTS_BYTES: usize = 256 << 20;

impl Problem {
    /// Read a record in LiveCodeBench's field names. `public_test_cases` and
    /// `private_test_cases` are JSON strings (or already arrays); private ones may be
    /// compressed (base64 → zlib → pickle of the JSON string). Each may hold at most
    /// [`DEFAULT_MAX_TESTS_BYTES`], decompressed or as written.
    pub fn from_record(record: &Value) -> Result<Self, RecordError> {
        Self::from_record_within(record, DEFAULT_MAX_TESTS_BYTES)
    }

    /// [`Problem::from_record`] with each test field allowed at most `max_tests_bytes`
    /// (decompressed, or as written); past it the record is refused, naming the field and
    /// the limit.
    pub fn from_record_within(record: &Value, max_tests_bytes: usize) -> Result<Self, RecordError> {
        let obj = record
            .as_object()
            .ok_or_else(|| bad("record", "expected a JSON object"))?;
        let id = obj
            .get("question_id")
            .and_then(|v| v.as_str())
            .map(str::to_owned);
        if !obj.contains_key("public_test_cases") && !obj.contains_key("private_test_cases") {
            return Err(bad(
                "public_test_cases",
                "missing (and no private_test_cases): not a LiveCodeBench record",
            ));
        }
        let mut tests = Vec::new();
        for field in ["public_test_cases", "private_test_cases"] {
            if let Some(v) = obj.get(field) {
                tests.extend(parse_tests(field, v, max_tests_bytes)?);
            }
        }
        let func_name = match obj.get("metadata") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.trim().is_empty() => None,
            Some(Value::String(s)) => {
                let meta: Value = serde_json::from_str(s)
                    .map_err(|e| bad("metadata", format!("not JSON: {e}")))?;
                func_name_of(&meta)?
            }
            Some(meta @ Value::Object(_)) => func_name_of(meta)?,
            Some(_) => return Err(bad("metadata", "expected a JSON string or object")),
        };
        if tests.iter().any(|t| t.kind == TestKind::Functional) && func_name.is_none() {
            return Err(bad(
                "metadata",
                "functional tests need metadata.func_name (the function to call)",
            ));
        }
        Ok(Self {
            id,
            tests,
            func_name,
        })
    }
}

fn func_name_of(meta: &Value) -> Result<Option<String>, RecordError> {
    match meta.get("func_name") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad("metadata.func_name", "expected a string")),
    }
}

fn parse_tests(field: &str, v: &Value, max_bytes: usize) -> Result<Vec<TestCase>, RecordError> {
    let too_big = |size: usize| {
        bad(
            field,
            format!(
                "holds {} MiB of tests, more than the limit of {} MiB (LiveCodeBench's records are far smaller)",
                size >> 20,
                max_bytes >> 20
            ),
        )
    };
    let text = match v {
        Value::Array(_) => {
            let tests = Vec::<TestCase>::deserialize(v)
                .map_err(|e| bad(field, format!("not a list of tests: {e}")))?;
            let size = tests
                .iter()
                .map(|t| t.input.len() + t.output.len())
                .fold(0usize, usize::saturating_add);
            return if size > max_bytes {
                Err(too_big(size))
            } else {
                Ok(tests)
            };
        }
        Value::String(s) => s.trim(),
        Value::Null => return Ok(Vec::new()),
        _ => return Err(bad(field, "expected a JSON string or array")),
    };
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let tests = if text.starts_with('[') {
        // Uncompressed tests are held to the limit of compressed ones, as written.
        if text.len() > max_bytes {
            return Err(too_big(text.len()));
        }
        serde_json::from_str(text)
    } else {
        let json = decompress_within(text, max_bytes).map_err(|m| bad(field, m))?;
        serde_json::from_str(&json)
    };
    tests.map_err(|e| bad(field, format!("not a list of tests: {e}")))
}

/// base64 → zlib → pickle (one string), as LiveCodeBench compresses private tests, up to
/// [`DEFAULT_MAX_TESTS_BYTES`] decompressed.
pub fn decompress(text: &str) -> Result<String, String> {
    decompress_within(text, DEFAULT_MAX_TESTS_BYTES)
}

/// [`decompress`] that refuses to inflate past `max_bytes` (a zlib bomb stops there).
pub fn decompress_within(text: &str, max_bytes: usize) -> Result<String, String> {
    use std::io::Read as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map_err(|e| format!("neither JSON nor base64: {e}"))?;
    let not_zlib = |e: std::io::Error| format!("base64 but not zlib: {e}");
    // Measure first, keeping nothing: a bomb is refused without its bytes ever being held,
    // and a record is then inflated into a buffer of exactly its size (growing one by
    // doubling would hold up to three times it, counting what the allocator keeps).
    let limit = u64::try_from(max_bytes)
        .unwrap_or(u64::MAX)
        .saturating_add(1);
    let size = std::io::copy(
        &mut flate2::read::ZlibDecoder::new(&raw[..]).take(limit),
        &mut std::io::sink(),
    )
    .map_err(not_zlib)?;
    if size >= limit {
        return Err(format!(
            "decompresses to more than {} MiB (the limit; LiveCodeBench's records are far smaller)",
            max_bytes >> 20
        ));
    }
    let mut pickled = Vec::with_capacity(usize::try_from(size).unwrap_or(max_bytes));
    flate2::read::ZlibDecoder::new(&raw[..])
        .take(size)
        .read_to_end(&mut pickled)
        .map_err(not_zlib)?;
    drop(raw);
    unpickle_string_owned(pickled)
}

/// Decode a pickle that holds exactly one `str`, accepting only the opcodes such records use
/// (PROTO, FRAME, the three unicode opcodes, MEMOIZE, STOP). Anything else — in particular
/// GLOBAL, REDUCE and every opcode that builds or calls objects — is rejected, so a record
/// can never make the grader execute anything.
pub fn unpickle_string(data: &[u8]) -> Result<String, String> {
    unpickle_string_owned(data.to_vec())
}

/// [`unpickle_string`] that reuses the pickle's buffer for the string (no second copy of a
/// large record).
fn unpickle_string_owned(mut data: Vec<u8>) -> Result<String, String> {
    let range = unpickled_range(&data)?;
    data.truncate(range.end);
    data.drain(..range.start);
    String::from_utf8(data).map_err(|e| {
        format!(
            "invalid UTF-8 at byte {} of the string",
            e.utf8_error().valid_up_to()
        )
    })
}

/// Where the one string of a pickle lies in it.
fn unpickled_range(data: &[u8]) -> Result<std::ops::Range<usize>, String> {
    let mut pos = 0usize;
    let mut value: Option<std::ops::Range<usize>> = None;
    let take = |pos: &mut usize, n: usize| -> Result<&[u8], String> {
        let end = pos
            .checked_add(n)
            .filter(|&e| e <= data.len())
            .ok_or_else(|| format!("pickle truncated at byte {pos}"))?;
        let s = &data[*pos..end];
        *pos = end;
        Ok(s)
    };
    loop {
        let at = pos;
        let op = *take(&mut pos, 1)?.first().expect("one byte");
        let len_prefixed =
            |pos: &mut usize, width: usize| -> Result<std::ops::Range<usize>, String> {
                let mut n = [0u8; 8];
                n[..width].copy_from_slice(take(pos, width)?);
                let n = usize::try_from(u64::from_le_bytes(n))
                    .map_err(|_| format!("string length too large at byte {at}"))?;
                let start = *pos;
                take(pos, n)?;
                Ok(start..*pos)
            };
        match op {
            0x80 => {
                // PROTO n
                let v = take(&mut pos, 1)?[0];
                if !(2..=5).contains(&v) {
                    return Err(format!("unsupported pickle protocol {v}"));
                }
            }
            0x95 => {
                take(&mut pos, 8)?; // FRAME: a length hint
            }
            0x8c | 0x58 | 0x8d => {
                // SHORT_BINUNICODE, BINUNICODE, BINUNICODE8
                if value.is_some() {
                    return Err(format!("pickle holds more than one value (byte {at})"));
                }
                let width = match op {
                    0x8c => 1,
                    0x58 => 4,
                    _ => 8,
                };
                value = Some(len_prefixed(&mut pos, width)?);
            }
            0x94 => {} // MEMOIZE
            0x2e => {
                // STOP
                if pos != data.len() {
                    return Err(format!("{} bytes after the pickle STOP", data.len() - pos));
                }
                return value.ok_or_else(|| "pickle holds no string".to_owned());
            }
            other => {
                return Err(format!(
                    "pickle opcode 0x{other:02x} at byte {at} is not allowed (only a single string may be unpickled)"
                ));
            }
        }
    }
}

/// The code of a completion: the text between the last two lines that contain three
/// backticks (LiveCodeBench's rule). `None` when there are fewer than two such lines.
pub fn extract_code(completion: &str) -> Option<String> {
    let lines: Vec<&str> = completion.split('\n').collect();
    let fences: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("```"))
        .map(|(i, _)| i)
        .collect();
    if fences.len() < 2 {
        return None;
    }
    let (start, end) = (fences[fences.len() - 2], fences[fences.len() - 1]);
    Some(lines[start + 1..end].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_the_last_fenced_block() {
        let c = "think\n```python\nprint(1)\n```\nthen\n```python\nx = 2\nprint(x)\n```\nbye";
        assert_eq!(extract_code(c).as_deref(), Some("x = 2\nprint(x)"));
        assert_eq!(extract_code("no code here"), None);
        assert_eq!(extract_code("```python\nprint(1)"), None);
        assert_eq!(extract_code("```\n```").as_deref(), Some(""));
    }

    /// Issue 32: uncompressed tests had no cap (a 620 MB line took 3.3 GB); they are held to
    /// the limit of compressed ones, as a string and as an array alike.
    #[test]
    fn uncompressed_tests_are_held_to_the_limit() {
        let tests = |n: usize| serde_json::json!([{ "input": "x".repeat(n), "output": "", "testtype": "stdin" }]);
        for field in ["public_test_cases", "private_test_cases"] {
            for n in [1000, 5000] {
                let as_array = serde_json::json!({ field: tests(n) });
                let as_text = serde_json::json!({ field: tests(n).to_string() });
                for record in [as_array, as_text] {
                    let read = Problem::from_record_within(&record, 4096);
                    if n < 4096 {
                        assert_eq!(read.unwrap().tests[0].input.len(), n);
                    } else {
                        let err = read.unwrap_err();
                        assert_eq!(err.field, field);
                        assert!(err.message.contains("limit of 0 MiB"), "{err}");
                    }
                }
            }
        }
    }

    #[test]
    fn unpickler_accepts_one_string_and_nothing_else() {
        // pickle.dumps("héllo", protocol=4)
        let ok = b"\x80\x04\x95\n\x00\x00\x00\x00\x00\x00\x00\x8c\x06h\xc3\xa9llo\x94.";
        assert_eq!(unpickle_string(ok).unwrap(), "héllo");
        // os.system via GLOBAL + REDUCE: the classic pickle exploit.
        let evil = b"\x80\x04\x95\x1c\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06system\x93\x8c\x04echo\x85R.";
        assert!(unpickle_string(evil).is_err());
        let err = unpickle_string(b"\x80\x02cos\nsystem\n(S'echo'\ntR.").unwrap_err();
        assert!(err.contains("0x63"), "{err}");
        assert!(unpickle_string(b"\x80\x04N.").unwrap_err().contains("0x4e"));
        assert!(
            unpickle_string(b"\x80\x04\x8c\x05ab")
                .unwrap_err()
                .contains("truncated")
        );
        assert!(unpickle_string(b"\x80\x04\x8c\x01a\x8c\x01b.").is_err());
        assert!(unpickle_string(b"\x80\x04\x8c\x01a.junk").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Arbitrary bytes are a pickle, a compressed field or a record, or refused: never a
        /// panic, never more than the limit.
        #[test]
        fn the_decoder_refuses_what_it_cannot_read(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = unpickle_string(&data);
            let text = String::from_utf8_lossy(&data);
            if let Ok(s) = decompress_within(&text, 1 << 16) {
                proptest::prop_assert!(s.len() <= 1 << 16);
            }
            if let Ok(record) = serde_json::from_slice::<Value>(&data) {
                let _ = Problem::from_record_within(&record, 1 << 16);
            }
        }
    }
}
