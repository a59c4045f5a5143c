//! Fuzz bytes read as a sequence of choices, for the structure-aware inputs: what makes a
//! document hostile is its shape (a reference chain, a cycle, a huge array, deep nesting), which
//! random JSON text almost never has, so the bytes choose a shape instead of spelling it.

/// The input's bytes, taken one choice at a time; once they run out, every choice is 0 (the
/// smallest, ending every loop and nesting), so any input builds a finite document.
pub struct Choices<'a> {
    data: &'a [u8],
    /// The most [`Choices::many`] gives: small documents run fast, large ones find what only
    /// size shows; the input's first byte picks (see [`documents`]).
    cap: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            cap: usize::MAX,
        }
    }

    /// A count of things (links, list entries, media types) below `n`, and below the cap.
    pub fn many(&mut self, n: usize) -> usize {
        self.below(n.min(self.cap))
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((first, rest)) => {
                self.data = rest;
                *first
            }
            None => 0,
        }
    }

    /// A number below `n` (0 when `n` is 0), from one byte or two.
    pub fn below(&mut self, n: usize) -> usize {
        if n <= 1 {
            return 0;
        }
        let raw = if n <= 256 {
            usize::from(self.byte())
        } else {
            usize::from(self.byte()) << 8 | usize::from(self.byte())
        };
        raw % n
    }

    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// What is left, taken whole.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }
}

/// `documents` JSON documents from an input: the first byte says whether the rest is raw text
/// (even: the byte fuzzer's view, documents separated by NUL bytes, missing ones `{}`) or the
/// choices `generate` builds them from (odd: structure-aware, with counts capped at 8, 128 or
/// 4 096 as its next bits say; depth is never capped). Generated documents are written out as
/// JSON, so that they reach the code under test the way a server's bytes do: through the parser
/// and its depth limit.
pub fn documents(
    data: &[u8],
    documents: usize,
    generate: impl Fn(&mut Choices<'_>, usize) -> serde_json::Value,
) -> Vec<Vec<u8>> {
    let mut choices = Choices::new(data);
    let mode = choices.byte();
    choices.cap = [8, 128, 4096, 4096][usize::from(mode >> 1 & 3)];
    if mode & 1 == 0 {
        let mut parts: Vec<Vec<u8>> = choices
            .rest()
            .split(|b| *b == 0)
            .take(documents)
            .map(<[u8]>::to_vec)
            .collect();
        parts.resize(documents, b"{}".to_vec());
        return parts;
    }
    (0..documents)
        .map(|i| serde_json::to_vec(&generate(&mut choices, i)).unwrap_or_default())
        .collect()
}
