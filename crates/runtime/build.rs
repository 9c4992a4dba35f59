//! Lays out the BPE ranks of cl100k and o200k for `src/tokens`, which
//! embeds them: counting tokens then needs no parsing at start-up and no
//! heap for the tables. The tokens come from tiktoken-rs, OpenAI's files
//! as that crate embeds them.
//!
//! For each encoding, in `OUT_DIR`:
//! - `<name>.bytes`: the bytes of every token, in rank order;
//! - `<name>.offsets`: where token `r` starts, as little-endian `u32`s,
//!   one per rank and one for the end;
//! - `<name>.table`: the hash table of ranks (see `src/tokens/hash.rs`).

use std::collections::HashSet;
use std::path::Path;

use tiktoken_rs::CoreBPE;

// The lookups' half of it is for `src/tokens` only.
#[allow(dead_code)]
#[path = "src/tokens/hash.rs"]
mod hash;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=src/tokens/hash.rs");
    let out = std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    let out = Path::new(&out);
    write_encoding(out, "cl100k_base", &tiktoken_rs::cl100k_base().expect("tiktoken-rs loads cl100k"));
    write_encoding(out, "o200k_base", &tiktoken_rs::o200k_base().expect("tiktoken-rs loads o200k"));
}

fn write_encoding(out: &Path, name: &str, bpe: &CoreBPE) {
    // Ordinary tokens have the ranks 0..n; special ones come after a gap.
    let tokens: Vec<Vec<u8>> = (0..).map_while(|rank| bpe.decode_bytes(&[rank]).ok()).collect();
    let specials = bpe.special_tokens();
    assert!(tokens.iter().all(|t| !t.is_empty() && !specials.contains(&*String::from_utf8_lossy(t))), "{name}");
    assert_eq!(tokens.iter().collect::<HashSet<_>>().len(), tokens.len(), "{name}: tokens are distinct");
    assert!(tokens.len() < hash::RANK_MASK as usize, "{name}: ranks fit in a slot");

    let mut bytes = Vec::new();
    let mut offsets = Vec::new();
    for token in &tokens {
        offsets.extend(offset(bytes.len()));
        bytes.extend(token);
    }
    offsets.extend(offset(bytes.len()));

    // At most 40% full: short probes.
    let bits = (tokens.len() * 5 / 2).next_power_of_two().trailing_zeros();
    let mut table = vec![hash::EMPTY; 1 << bits];
    for (rank, token) in (0..).zip(&tokens) {
        let hash = hash::hash(token);
        let mut i = hash::home(hash, bits);
        while table[i] != hash::EMPTY {
            i = (i + 1) & (table.len() - 1);
        }
        table[i] = hash::slot(hash, rank);
    }
    let table: Vec<u8> = table.iter().flat_map(|slot| slot.to_le_bytes()).collect();

    for (ext, contents) in [("bytes", bytes), ("offsets", offsets), ("table", table)] {
        let path = out.join(format!("{name}.{ext}"));
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
}

fn offset(at: usize) -> [u8; 4] {
    u32::try_from(at).expect("token bytes fit in u32 offsets").to_le_bytes()
}
