//! Transforms that plugins and the sluice host share, so that a plugin and
//! the host's built-in stage compute exactly the same thing.

/// The geometry and normalisation of [`image_normalize`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImageNormalize {
    /// Output height.
    pub height: usize,
    /// Output width.
    pub width: usize,
    /// Per-channel mean, subtracted after scaling.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation, divided by after subtracting the mean.
    pub std: Vec<f32>,
    /// Raw values are divided by this first (255 maps bytes to 0..1).
    pub scale: f32,
}

/// u8 images, `rows × in_h × in_w × channels` (HWC), into f32
/// `rows × channels × height × width` (CHW): resampled bilinearly at pixel
/// centres when the sizes differ, then `(x / scale − mean[c]) / std[c]`.
/// `channels` is `mean.len()`; `pixels` must hold `rows × in_h × in_w ×
/// channels` bytes and `in_h`, `in_w` must be at least 1.
pub fn image_normalize(params: &ImageNormalize, pixels: &[u8], rows: usize, in_h: usize, in_w: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * params.mean.len() * params.height * params.width];
    image_normalize_into(params, pixels, rows, in_h, in_w, &mut out);
    out
}

/// [`image_normalize`] into `out`, which holds `rows × channels × height ×
/// width` values: lets a caller bound and reuse the buffer, and work in
/// pieces of a few rows.
pub fn image_normalize_into(
    params: &ImageNormalize,
    pixels: &[u8],
    rows: usize,
    in_h: usize,
    in_w: usize,
    out: &mut [f32],
) {
    let c = params.mean.len();
    let (h, w) = (params.height, params.width);
    let inv_std: Vec<f32> = params.std.iter().map(|s| 1.0 / s).collect();
    let sy = in_h as f32 / h as f32;
    let sx = in_w as f32 / w as f32;
    for n in 0..rows {
        let src = &pixels[n * in_h * in_w * c..(n + 1) * in_h * in_w * c];
        let dst = &mut out[n * c * h * w..(n + 1) * c * h * w];
        for y in 0..h {
            let fy = ((y as f32 + 0.5) * sy - 0.5).clamp(0.0, (in_h - 1) as f32);
            let (y0, ty) = (fy.floor() as usize, fy.fract());
            let y1 = (y0 + 1).min(in_h - 1);
            for x in 0..w {
                let fx = ((x as f32 + 0.5) * sx - 0.5).clamp(0.0, (in_w - 1) as f32);
                let (x0, tx) = (fx.floor() as usize, fx.fract());
                let x1 = (x0 + 1).min(in_w - 1);
                for ch in 0..c {
                    let at = |yy: usize, xx: usize| src[(yy * in_w + xx) * c + ch] as f32;
                    let top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * tx;
                    let bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * tx;
                    let value = top + (bottom - top) * ty;
                    dst[(ch * h + y) * w + x] = (value / params.scale - params.mean[ch]) * inv_std[ch];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_a_transpose_and_normalisation() {
        let params = ImageNormalize { height: 2, width: 2, mean: vec![0.5; 3], std: vec![0.5; 3], scale: 255.0 };
        let hwc: Vec<u8> = (0..4u8).flat_map(|p| (0..3u8).map(move |c| 10 * p + c)).collect();
        let out = image_normalize(&params, &hwc, 1, 2, 2);
        for c in 0..3 {
            for p in 0..4 {
                let want = ((10 * p + c) as f32 / 255.0 - 0.5) / 0.5;
                assert!((out[c * 4 + p] - want).abs() < 1e-6);
            }
        }
        let flat = vec![51u8; 4 * 4 * 3];
        let out = image_normalize(&params, &flat, 1, 4, 4);
        assert!(out.iter().all(|&x| (x - (0.2 - 0.5) / 0.5).abs() < 1e-6));
    }
}
