//! An image as the user sent it, decoded and checked ([`Picture`]), and made into what an
//! encoder reads ([`Picture::fit_square`]: resized into a square, padded, normalised, as
//! llama.cpp's `mtmd-image.cpp` does for Gemma 3).
//!
//! An image is untrusted input as a model file is: it is decoded by the `image` crate (JPEG,
//! PNG, WebP; pure Rust) under limits set before a pixel is decoded — at most [`MAX_BYTES`]
//! of file and [`MAX_PIXELS`] pixels — so a decompression bomb is an error, not an allocation
//! of gigabytes. Whatever the bytes, [`Picture::decode`] returns an [`ImageError`] naming what
//! is wrong, never panics.

use image::{imageops, ImageFormat, ImageReader, RgbImage};

use super::resample::resize;
pub use super::resample::Filter;

/// Largest image file taken (20 MB): a photo from a phone is 2–8.
pub const MAX_BYTES: usize = 20 << 20;
/// Most pixels an image may have (50 megapixels): a 8,660 × 5,773 photo, past any camera's.
pub const MAX_PIXELS: u64 = 50_000_000;

/// Why an image was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    #[error("the image is {size} bytes; the limit is {limit} (20 MB)", limit = MAX_BYTES)]
    TooLarge { size: usize },
    #[error("the image is {width} × {height} pixels; the limit is 50 megapixels")]
    TooManyPixels { width: u32, height: u32 },
    #[error("not an image Rill reads (it reads JPEG, PNG and WebP)")]
    UnknownFormat,
    #[error("the image is {format}; Rill reads JPEG, PNG and WebP")]
    UnsupportedFormat { format: String },
    #[error("the {format} image is damaged: {message}")]
    Damaged { format: String, message: String },
    #[error("the image is empty (0 pixels)")]
    Empty,
}

/// A decoded image: 8-bit RGB (an alpha channel is dropped, as llama.cpp's `stb_image` drops
/// it), with an identity of its content for caches.
#[derive(Clone)]
pub struct Picture {
    rgb: RgbImage,
    /// A hash of the file's bytes: the same picture sent twice is the same run of tokens.
    id: u64,
}

impl std::fmt::Debug for Picture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Picture({}×{}, {:016x})",
            self.width(),
            self.height(),
            self.id
        )
    }
}

/// The pixels an encoder reads: `[3][height][width]` (planar RGB, rows top to bottom), each
/// value `(v/255 − mean)/std` for its channel.
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    pub values: Vec<f32>,
}

impl Pixels {
    /// Its grid of `unit`-pixel squares (`nx`, `ny`), where it is a whole number of them.
    pub(crate) fn units(&self, unit: usize) -> candle_core::Result<(usize, usize)> {
        let whole = |n: usize| n > 0 && n.is_multiple_of(unit);
        if !(whole(self.width) && whole(self.height)) {
            candle_core::bail!(
                "a {} × {} image is not whole {unit}-pixel units",
                self.width,
                self.height
            );
        }
        Ok((self.width / unit, self.height / unit))
    }

    /// The values of the `p`-pixel patches at `place` (each patch's row and column), a row
    /// each, in a convolution kernel's order: channel, then row, then column.
    pub(crate) fn patches(&self, p: usize, place: &[(usize, usize)]) -> Vec<f32> {
        let k = 3 * p * p;
        let plane = self.width * self.height;
        let mut patches = vec![0f32; place.len() * k];
        for (row, &(py, px)) in patches.chunks_exact_mut(k).zip(place) {
            for c in 0..3 {
                for y in 0..p {
                    let from = c * plane + (py * p + y) * self.width + px * p;
                    row[c * p * p + y * p..][..p].copy_from_slice(&self.values[from..from + p]);
                }
            }
        }
        patches
    }
}

/// The size an image of `width` × `height` is resized to where its aspect ratio is kept (the
/// Qwen-VL processors' `smart_resize`, as llama.cpp's `calc_size_preserved_ratio` computes
/// it): each side rounded to a multiple of `align`, then scaled down to at most `max_pixels`
/// or up to at least `min_pixels`, keeping whole multiples of `align`.
pub fn preserved_ratio(
    width: u32,
    height: u32,
    align: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> (usize, usize) {
    let f = align as f32;
    let (w, h) = (width as f32, height as f32);
    let round = |x: f32| (x / f).round() as usize * align;
    let ceil = |x: f32| (x / f).ceil() as usize * align;
    let floor = |x: f32| (x / f).floor() as usize * align;
    let (mut w_bar, mut h_bar) = (align.max(round(w)), align.max(round(h)));
    if w_bar * h_bar > max_pixels {
        let beta = (h * w / max_pixels as f32).sqrt();
        h_bar = align.max(floor(h / beta));
        w_bar = align.max(floor(w / beta));
    } else if w_bar * h_bar < min_pixels {
        let beta = (min_pixels as f32 / (h * w)).sqrt();
        h_bar = ceil(h * beta);
        w_bar = ceil(w * beta);
    }
    // A picture far narrower than it is long (1 × 50,000,000 is within the pixel limit) keeps
    // its short side at one unit after the scaling above and could still come out at hundreds
    // of thousands of units: its long side is cut to what the limit leaves (llama.cpp does
    // not; the Qwen-VL processors refuse such pictures outright).
    if w_bar * h_bar > max_pixels {
        let cut = |short: usize| align.max(max_pixels / short / align * align);
        match w_bar >= h_bar {
            true => w_bar = cut(h_bar),
            false => h_bar = cut(w_bar),
        }
    }
    (w_bar, h_bar)
}

impl Picture {
    /// The width and height a JPEG, PNG or WebP file's header gives, checked against the
    /// limits as [`Picture::decode`] checks them, without decoding a pixel.
    pub fn dimensions(bytes: &[u8]) -> Result<(u32, u32), ImageError> {
        Self::header(bytes).map(|(_, w, h)| (w, h))
    }

    fn header(bytes: &[u8]) -> Result<(ImageFormat, u32, u32), ImageError> {
        if bytes.len() > MAX_BYTES {
            return Err(ImageError::TooLarge { size: bytes.len() });
        }
        let reader = ImageReader::new(std::io::Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|_| ImageError::UnknownFormat)?;
        let format = reader.format().ok_or(ImageError::UnknownFormat)?;
        if !matches!(
            format,
            ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP
        ) {
            return Err(ImageError::UnsupportedFormat {
                format: format!("{format:?}"),
            });
        }
        let name = format!("{format:?}").to_uppercase();
        let damaged = |e: image::ImageError| ImageError::Damaged {
            format: name.clone(),
            message: e.to_string(),
        };
        // The size first, from the header, so the limit holds before anything is allocated.
        let (width, height) = reader.into_dimensions().map_err(damaged)?;
        if u64::from(width) * u64::from(height) > MAX_PIXELS {
            return Err(ImageError::TooManyPixels { width, height });
        }
        if width == 0 || height == 0 {
            return Err(ImageError::Empty);
        }
        Ok((format, width, height))
    }

    /// Decodes a JPEG, PNG or WebP file's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Picture, ImageError> {
        let (format, width, height) = Self::header(bytes)?;
        let name = format!("{format:?}").to_uppercase();
        let damaged = |e: image::ImageError| ImageError::Damaged {
            format: name.clone(),
            message: e.to_string(),
        };
        let mut reader = ImageReader::with_format(std::io::Cursor::new(bytes), format);
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(width);
        limits.max_image_height = Some(height);
        // RGBA at 16 bits per channel, the most a decoder holds per pixel, and room for its
        // buffers.
        limits.max_alloc = Some(MAX_PIXELS * 8 + (64 << 20));
        reader.limits(limits);
        let rgb = reader.decode().map_err(damaged)?.to_rgb8();
        Ok(Picture {
            rgb,
            id: crate::message::content_id(bytes),
        })
    }

    pub fn width(&self) -> u32 {
        self.rgb.width()
    }

    pub fn height(&self) -> u32 {
        self.rgb.height()
    }

    /// The identity of the file's content (a 64-bit hash of its bytes).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The picture scaled to fit a `side` × `side` square with its aspect ratio kept (bilinear,
    /// averaging over the pixels each output pixel covers when it shrinks), centred on black,
    /// then normalised per channel: llama.cpp's fixed-size preprocessing (`img_tool::resize`
    /// with its default ceiling padding).
    pub fn fit_square(&self, side: usize, mean: [f32; 3], std: [f32; 3]) -> Pixels {
        self.fit(side, side, Filter::Bilinear, mean, std)
    }

    /// The picture scaled to fit `width` × `height` with its aspect ratio kept (the nearer
    /// side filled, the other rounded up), centred on black, then normalised per channel:
    /// llama.cpp's `img_tool::resize` with its default ceiling padding.
    pub fn fit(
        &self,
        width: usize,
        height: usize,
        filter: Filter,
        mean: [f32; 3],
        std: [f32; 3],
    ) -> Pixels {
        let (tw, th) = (width as u32, height as u32);
        let framed = if (self.width(), self.height()) == (tw, th) {
            self.rgb.clone()
        } else {
            let scale =
                (width as f32 / self.width() as f32).min(height as f32 / self.height() as f32);
            let fit = |n: u32, limit: u32| ((n as f32 * scale).ceil() as u32).clamp(1, limit);
            let (w, h) = (fit(self.width(), tw), fit(self.height(), th));
            let resized = resize(&self.rgb, w, h, filter);
            let mut framed = RgbImage::new(tw, th);
            imageops::replace(
                &mut framed,
                &resized,
                i64::from((tw - w) / 2),
                i64::from((th - h) / 2),
            );
            framed
        };
        let plane = width * height;
        let mut values = vec![0f32; 3 * plane];
        for (i, px) in framed.pixels().enumerate() {
            for c in 0..3 {
                values[c * plane + i] = (f32::from(px.0[c]) / 255.0 - mean[c]) / std[c];
            }
        }
        Pixels {
            width,
            height,
            values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(width: u32, height: u32, color: [u8; 3]) -> Vec<u8> {
        let img = RgbImage::from_pixel(width, height, image::Rgb(color));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn a_size_kept_in_ratio_stays_within_its_pixels() {
        // llama.cpp's sizes for its test photo and a 300 × 200 PNG (28-pixel units).
        assert_eq!(preserved_ratio(640, 488, 28, 6272, 3_211_264), (644, 476));
        assert_eq!(preserved_ratio(300, 200, 28, 6272, 3_211_264), (308, 196));
        // A sliver within the 50-megapixel limit: its long side is cut to the pixels left.
        let (w, h) = preserved_ratio(1, 50_000_000, 28, 6272, 3_211_264);
        assert!(w == 28 && h * w <= 3_211_264 && h % 28 == 0, "{w} × {h}");
        let (w, h) = preserved_ratio(50_000_000, 1, 28, 6272, 3_211_264);
        assert!(h == 28 && h * w <= 3_211_264, "{w} × {h}");
        // A tiny picture is scaled up to the fewest tokens.
        let (w, h) = preserved_ratio(10, 10, 28, 6272, 3_211_264);
        assert!(w * h >= 6272, "{w} × {h}");
    }

    #[test]
    fn a_wide_picture_is_fitted_into_the_square_and_centred_on_black() {
        let pic = Picture::decode(&png(40, 20, [255, 0, 255])).unwrap();
        assert_eq!((pic.width(), pic.height()), (40, 20));
        let px = pic.fit_square(10, [0.5; 3], [0.5; 3]);
        assert_eq!(px.values.len(), 300);
        // Scaled to 10 × 5, rows 2..7 hold it; black is (0 − 0.5)/0.5 = −1.
        let at = |c: usize, y: usize, x: usize| px.values[c * 100 + y * 10 + x];
        for x in 0..10 {
            assert_eq!((at(0, 0, x), at(0, 1, x), at(0, 7, x)), (-1.0, -1.0, -1.0));
            for y in 2..7 {
                assert_eq!((at(0, y, x), at(1, y, x), at(2, y, x)), (1.0, -1.0, 1.0));
            }
        }
    }

    #[test]
    fn bad_images_are_named_errors() {
        assert_eq!(
            Picture::decode(b"hello, not an image").unwrap_err(),
            ImageError::UnknownFormat
        );
        let mut cut = png(64, 64, [1, 2, 3]);
        cut.truncate(cut.len() / 2);
        assert!(matches!(
            Picture::decode(&cut).unwrap_err(),
            ImageError::Damaged { format, .. } if format == "PNG"
        ));
        let big = vec![0u8; MAX_BYTES + 1];
        assert!(matches!(
            Picture::decode(&big).unwrap_err(),
            ImageError::TooLarge { .. }
        ));
        // A GIF is an image, not one of ours.
        let gif = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;";
        assert!(matches!(
            Picture::decode(gif).unwrap_err(),
            ImageError::UnsupportedFormat { .. } | ImageError::UnknownFormat
        ));
    }

    #[test]
    fn a_header_that_claims_gigapixels_is_refused_before_decoding() {
        // A valid PNG header of 100,000 × 100,000 pixels, and no data: a bomb's first bytes.
        let mut bytes = png(1, 1, [0, 0, 0]);
        bytes[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        bytes[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        // The header chunk's checksum (over its type and data) made right again.
        let crc = crc32(&bytes[12..29]);
        bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = Picture::decode(&bytes).unwrap_err();
        assert_eq!(
            err,
            ImageError::TooManyPixels {
                width: 100_000,
                height: 100_000
            }
        );
    }

    /// PNG's CRC-32 (ISO 3309), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = !0u32;
        for b in bytes {
            c ^= u32::from(*b);
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }

    #[test]
    fn the_same_bytes_have_the_same_id_and_others_another() {
        let a = Picture::decode(&png(8, 8, [9, 9, 9])).unwrap();
        let b = Picture::decode(&png(8, 8, [9, 9, 9])).unwrap();
        let c = Picture::decode(&png(8, 8, [9, 9, 10])).unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
    }
}
