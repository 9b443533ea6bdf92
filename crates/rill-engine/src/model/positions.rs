//! Where a sequence's rows sit in RoPE's positions when that is not their slot in the KV cache:
//! Qwen-VL's M-RoPE gives an image of `nx` × `ny` rows the positions of `max(nx, ny)` tokens —
//! each row its time (the image's first position), height and width (its place in the
//! picture) — so the text after it goes on from there (llama.cpp's
//! `mtmd_image_tokens_get_n_pos` and `mtmd_image_tokens_get_decoder_pos`). Text rows hold
//! their position in every section.

/// A row's positions: time, height, width (M-RoPE's extra one is 0).
pub type Pos3 = [usize; 3];

/// The images a cache holds laid out so: (first slot, rows, positions they take).
#[derive(Clone, Debug, Default)]
pub struct Shifts(Vec<(usize, usize, usize)>);

impl Shifts {
    /// Slots minus positions after every image held.
    pub fn total(&self) -> usize {
        self.0.iter().map(|&(_, rows, took)| rows - took).sum()
    }

    /// Forgets the images that are not whole within the first `len` slots.
    pub fn cut(&mut self, len: usize) {
        self.0.retain(|&(first, rows, _)| first + rows <= len);
    }

    /// The images whole within the first `len` slots.
    pub fn upto(&self, len: usize) -> Shifts {
        let mut s = self.clone();
        s.cut(len);
        s
    }

    /// Lays out a step of `t` rows appended at slot `len`, with images (row in the step, `nx`,
    /// `ny`): each row's positions, the images recorded.
    pub fn step(&mut self, len: usize, t: usize, images: &[(usize, usize, usize)]) -> Vec<Pos3> {
        let mut p = len - self.total().min(len);
        let mut out = Vec::with_capacity(t);
        let mut images = images.to_vec();
        images.sort_unstable();
        let mut next = images.iter().peekable();
        while out.len() < t {
            match next.peek() {
                Some(&&(at, nx, ny)) if at == out.len() && nx > 0 => {
                    next.next();
                    let rows = (nx * ny).min(t - at);
                    out.extend((0..rows).map(|r| [p, p + r / nx, p + r % nx]));
                    let took = nx.max(ny);
                    self.0.push((len + at, rows, took.min(rows)));
                    p += took;
                }
                _ => {
                    out.push([p; 3]);
                    p += 1;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_takes_the_positions_of_its_longer_side() {
        let mut s = Shifts::default();
        // Two text rows, a 3 × 2 image, one text row.
        let pos = s.step(0, 9, &[(2, 3, 2)]);
        assert_eq!(pos[..2], [[0; 3], [1; 3]]);
        assert_eq!(
            pos[2..8],
            [
                [2, 2, 2],
                [2, 2, 3],
                [2, 2, 4],
                [2, 3, 2],
                [2, 3, 3],
                [2, 3, 4]
            ]
        );
        assert_eq!(pos[8], [5; 3]);
        assert_eq!(s.total(), 3);
        // The next step goes on from there.
        assert_eq!(s.step(9, 1, &[]), vec![[6; 3]]);
        // Cut back into the image: it is forgotten, and positions are slots again.
        s.cut(5);
        assert_eq!(s.total(), 0);
    }

    #[test]
    fn sections_share_pairs_in_runs_or_in_turns() {
        use super::super::config::section_of;
        use super::super::family::Mrope;
        // Qwen2.5-VL's 16, 24, 24 of 64 pairs: runs.
        let runs = [16, 24, 24, 0];
        let of = |k| section_of(runs, Mrope::Sectioned, k);
        assert_eq!(
            (of(0), of(15), of(16), of(39), of(40), of(63)),
            (0, 0, 1, 1, 2, 2)
        );
        // Qwen3.5's 3, 3, 2 of 8 pairs (imrope): t, h, w in turn while each has pairs left.
        let turns: Vec<usize> = (0..8)
            .map(|k| section_of([3, 3, 2, 0], Mrope::Interleaved, k))
            .collect();
        assert_eq!(turns, vec![0, 1, 2, 0, 1, 2, 0, 1]);
        // A fourth section holds the pairs left to the extra position.
        assert_eq!(section_of([2, 1, 1, 2], Mrope::Sectioned, 4), 3);
    }
}
