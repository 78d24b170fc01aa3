//! The worker's memory, in a small RocksDB of its own: the answer given to
//! each command, and the next command offset of each partition of the
//! commands topic.
//!
//! An answer is written (synced) before it is published, and the offset
//! moves past a command only once its answer is acknowledged. So a worker
//! killed at any point and restarted on the same directory reads the
//! unfinished commands again and publishes the answers it already gave,
//! byte for byte, instead of asking the destination a second time (which
//! might now say something else). Answers are kept `retention` after they
//! were given, not only until the offset passes them: the pipeline
//! re-publishes a command byte-identical after its own crash, at a later
//! offset, and that copy must get the same answer too.

use std::path::Path;

use rocksdb::{Direction, IteratorMode, Options, WriteBatch, WriteOptions, DB};

/// A failure of the worker's store.
#[derive(Debug, thiserror::Error)]
#[error("probe worker store: {0}")]
pub struct LedgerError(#[from] rocksdb::Error);

/// A stored answer: the record key (the entity) and value.
pub type StoredAnswer = (Vec<u8>, Vec<u8>);

/// The worker's store.
pub struct Ledger {
    db: DB,
}

const ANSWER: &[u8] = b"a\0";

fn answer_key(command_id: &str) -> Vec<u8> {
    [ANSWER, command_id.as_bytes()].concat()
}

/// Offsets are kept per topic: a worker pointed at another commands topic
/// (renamed, recreated under another name) must not skip its commands.
fn offset_key(topic: &str, partition: i32) -> Vec<u8> {
    [b"o\0".as_slice(), topic.as_bytes(), b"\0", &partition.to_be_bytes()].concat()
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

/// Stored value: answered-at (ms, 8 bytes), key length (4 bytes), key, value.
fn decode(bytes: &[u8]) -> (i64, StoredAnswer) {
    let at = i64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
    let len = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    (at, (bytes[12..12 + len].to_vec(), bytes[12 + len..].to_vec()))
}

impl Ledger {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        // Small values: nothing worth compressing.
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        Ok(Ledger { db: DB::open(&opts, dir)? })
    }

    /// The answer already given to `command_id`, if it is still kept.
    pub fn answer(&self, command_id: &str) -> Result<Option<StoredAnswer>, LedgerError> {
        Ok(self.db.get(answer_key(command_id))?.map(|b| decode(&b).1))
    }

    /// Keeps the answers (command id, key, value) given at `at` (ms),
    /// synced, before they are published.
    pub fn record<'a>(
        &self,
        at: i64,
        answers: impl IntoIterator<Item = (&'a str, &'a [u8], &'a [u8])>,
    ) -> Result<(), LedgerError> {
        let mut batch = WriteBatch::default();
        for (id, key, value) in answers {
            let len = u32::try_from(key.len()).expect("a record key is far below 4 GiB");
            batch.put(answer_key(id), [at.to_be_bytes().as_slice(), &len.to_be_bytes(), key, value].concat());
        }
        Ok(self.db.write_opt(batch, &synced())?)
    }

    /// Moves `partition` of `topic` to `next`.
    pub fn advance(&self, topic: &str, partition: i32, next: i64) -> Result<(), LedgerError> {
        Ok(self.db.put_opt(offset_key(topic, partition), next.to_be_bytes(), &synced())?)
    }

    /// The next command offset of `partition` of `topic`, if the worker has one.
    pub fn next_offset(&self, topic: &str, partition: i32) -> Result<Option<i64>, LedgerError> {
        Ok(self
            .db
            .get(offset_key(topic, partition))?
            .map(|b| i64::from_be_bytes(b.as_slice().try_into().expect("offsets are 8 bytes"))))
    }

    /// Forgets the answers given before `before` (ms); returns how many.
    pub fn purge(&self, before: i64) -> Result<usize, LedgerError> {
        let mut batch = WriteBatch::default();
        let mut n = 0;
        for item in self.db.iterator(IteratorMode::From(ANSWER, Direction::Forward)) {
            let (k, v) = item?;
            if !k.starts_with(ANSWER) {
                break;
            }
            if decode(&v).0 < before {
                batch.delete(k);
                n += 1;
            }
        }
        self.db.write(batch)?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_survive_a_reopen_until_they_age_out() {
        let dir = std::env::temp_dir().join(format!("probe-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let l = Ledger::open(&dir).unwrap();
            l.record(100, [("c1", b"e1".as_slice(), b"v1".as_slice())]).unwrap();
            l.record(200, [("c2", b"e2".as_slice(), b"v2".as_slice())]).unwrap();
            l.advance("cmds", 3, 11).unwrap();
        }
        let l = Ledger::open(&dir).unwrap();
        assert_eq!(l.answer("c1").unwrap(), Some((b"e1".to_vec(), b"v1".to_vec())));
        assert_eq!(l.next_offset("cmds", 3).unwrap(), Some(11));
        assert_eq!(l.next_offset("other", 3).unwrap(), None, "offsets are per topic");
        assert_eq!(l.next_offset("cmds", 4).unwrap(), None);
        assert_eq!(l.purge(150).unwrap(), 1);
        assert_eq!(l.answer("c1").unwrap(), None);
        assert_eq!(l.answer("c2").unwrap(), Some((b"e2".to_vec(), b"v2".to_vec())));
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
