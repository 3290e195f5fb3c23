//! TensorBoard event files: `tensorboard --logdir runs/` reads the scalars of every run.
//!
//! The format is TFRecord framing (length, masked CRC-32C of the length, data, masked CRC-32C
//! of the data) around `Event` protocol buffers; the few fields needed are encoded by hand.

use std::io::Write;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::atomic::AppendFile;

fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | 2), out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// An `Event` with wall time, step and either a file version or one scalar.
fn event(wall_time: f64, step: i64, body: &[u8], body_field: u32) -> Vec<u8> {
    let mut e = Vec::new();
    varint(1 << 3 | 1, &mut e); // wall_time: double
    e.extend_from_slice(&wall_time.to_le_bytes());
    varint(2 << 3, &mut e); // step: int64
    varint(step as u64, &mut e);
    bytes_field(body_field, body, &mut e);
    e
}

fn scalar_summary(tag: &str, value: f32) -> Vec<u8> {
    let mut v = Vec::new();
    bytes_field(1, tag.as_bytes(), &mut v); // Value.tag
    varint(2 << 3 | 5, &mut v); // Value.simple_value: float
    v.extend_from_slice(&value.to_le_bytes());
    let mut summary = Vec::new();
    bytes_field(1, &v, &mut summary); // Summary.value
    summary
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Writes scalars to an event file in a run folder.
#[derive(Debug)]
pub struct EventWriter {
    file: AppendFile,
}

impl EventWriter {
    /// Create `dir/events.out.tfevents.<time>.areal`.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        let path = dir.join(format!("events.out.tfevents.{}.areal", now() as u64));
        let mut writer = Self {
            file: AppendFile::create(&path)?,
        };
        writer.record(&event(now(), 0, b"brain.Event:2", 3))?;
        writer.flush()?;
        Ok(writer)
    }

    /// Open the event file `path` to go on after its first `bytes` bytes (what follows is cut
    /// off, so no step is recorded twice).
    pub fn resume(path: &Path, bytes: u64) -> std::io::Result<Self> {
        AppendFile::resume(path, bytes).map(|file| Self { file })
    }

    /// Put everything written on disk; the file's length.
    pub fn sync(&mut self) -> std::io::Result<u64> {
        self.file.sync()
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    fn record(&mut self, data: &[u8]) -> std::io::Result<()> {
        let len = (data.len() as u64).to_le_bytes();
        let out = self.file.writer();
        out.write_all(&len)?;
        out.write_all(&masked_crc(&len).to_le_bytes())?;
        out.write_all(data)?;
        out.write_all(&masked_crc(data).to_le_bytes())
    }

    /// Record `value` for `tag` at `step`.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64) -> std::io::Result<()> {
        self.record(&event(now(), step, &scalar_summary(tag, value as f32), 5))
    }

    /// Write buffered events to disk.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.file.writer().flush()
    }
}

/// Read back the records of an event file, checking both CRCs; returns each record's data.
pub fn read_records(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let header = bytes.get(at..at + 12).ok_or("truncated header")?;
        let len = u64::from_le_bytes(header[..8].try_into().expect("8 bytes")) as usize;
        if masked_crc(&header[..8])
            != u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"))
        {
            return Err(format!("bad length CRC at byte {at}"));
        }
        let data = bytes.get(at + 12..at + 12 + len).ok_or("truncated data")?;
        let crc = bytes
            .get(at + 12 + len..at + 16 + len)
            .ok_or("truncated CRC")?;
        if masked_crc(data) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
            return Err(format!("bad data CRC at byte {at}"));
        }
        out.push(data.to_vec());
        at += 16 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_of_known_values() {
        // CRC-32C's standard check value, masked as TFRecord masks it
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(masked_crc(b""), 0xa282_ead8);
        let crc = 0xE306_9283u32;
        assert_eq!(
            masked_crc(b"123456789"),
            crc.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn scalars_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("eval/accuracy", 3, 0.25).unwrap();
        w.flush().unwrap();
        let records = read_records(w.path()).unwrap();
        assert_eq!(records.len(), 2);
        assert!(records[0].windows(13).any(|s| s == b"brain.Event:2"));
        let r = &records[1];
        assert!(r.windows(13).any(|s| s == b"eval/accuracy"));
        assert!(r.windows(4).any(|s| s == 0.25f32.to_le_bytes()));
        // step field (2 << 3 = 0x10) followed by varint 3
        assert!(r.windows(2).any(|s| s == [0x10, 3]));
    }
}
