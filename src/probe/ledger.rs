//! The worker's memory, in a small RocksDB of its own: the answer given to
//! each command whose offset is not yet passed, and the next command offset
//! of each partition.
//!
//! An answer is written (synced) before it is published, and the offset
//! moves past a command only once its answer is acknowledged, in one batch
//! that also forgets the answer. So a worker killed at any point and
//! restarted on the same directory reads the unfinished commands again and
//! publishes the answers it already gave, byte for byte, instead of asking
//! the destination a second time (which might now say something else).

use std::path::Path;

use rocksdb::{Options, WriteBatch, WriteOptions, DB};

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

fn answer_key(command_id: &str) -> Vec<u8> {
    [b"a\0".as_slice(), command_id.as_bytes()].concat()
}

fn offset_key(partition: i32) -> Vec<u8> {
    [b"o\0".as_slice(), &partition.to_be_bytes()].concat()
}

fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

impl Ledger {
    /// Opens (or creates) the store in `dir`.
    pub fn open(dir: &Path) -> Result<Ledger, LedgerError> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        // A handful of small values: nothing to compress.
        opts.set_compression_type(rocksdb::DBCompressionType::None);
        Ok(Ledger { db: DB::open(&opts, dir)? })
    }

    /// The answer already given to `command_id`, if its offset is not passed.
    pub fn answer(&self, command_id: &str) -> Result<Option<StoredAnswer>, LedgerError> {
        let Some(bytes) = self.db.get(answer_key(command_id))? else { return Ok(None) };
        // Written by `record` below as key length, key, value.
        let (len, rest) = bytes.split_at(4);
        let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
        Ok(Some((rest[..len].to_vec(), rest[len..].to_vec())))
    }

    /// Keeps the answers (command id, key, value), synced, before they are
    /// published.
    pub fn record<'a>(
        &self,
        answers: impl IntoIterator<Item = (&'a str, &'a [u8], &'a [u8])>,
    ) -> Result<(), LedgerError> {
        let mut batch = WriteBatch::default();
        for (id, key, value) in answers {
            let len = u32::try_from(key.len()).expect("a record key is far below 4 GiB");
            batch.put(answer_key(id), [&len.to_be_bytes(), key, value].concat());
        }
        Ok(self.db.write_opt(batch, &synced())?)
    }

    /// Moves partition `partition` to `next` and forgets the answers of the
    /// commands now behind it.
    pub fn advance<'a>(
        &self,
        partition: i32,
        next: i64,
        answered: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), LedgerError> {
        let mut batch = WriteBatch::default();
        for id in answered {
            batch.delete(answer_key(id));
        }
        batch.put(offset_key(partition), next.to_be_bytes());
        Ok(self.db.write_opt(batch, &synced())?)
    }

    /// The next command offset of `partition`, if the worker has one.
    pub fn next_offset(&self, partition: i32) -> Result<Option<i64>, LedgerError> {
        Ok(self
            .db
            .get(offset_key(partition))?
            .map(|b| i64::from_be_bytes(b.as_slice().try_into().expect("offsets are 8 bytes"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_survive_a_reopen_until_the_offset_passes_them() {
        let dir = std::env::temp_dir().join(format!("probe-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let l = Ledger::open(&dir).unwrap();
            l.record([("c1", b"e1".as_slice(), b"v1".as_slice()), ("c2", b"e2".as_slice(), b"v2".as_slice())]).unwrap();
            l.advance(3, 11, ["c1"]).unwrap();
        }
        let l = Ledger::open(&dir).unwrap();
        assert_eq!(l.answer("c1").unwrap(), None);
        assert_eq!(l.answer("c2").unwrap(), Some((b"e2".to_vec(), b"v2".to_vec())));
        assert_eq!(l.next_offset(3).unwrap(), Some(11));
        assert_eq!(l.next_offset(4).unwrap(), None);
        drop(l);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
