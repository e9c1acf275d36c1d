/*
 * (x - mean) / std of interleaved uint8 RGB pixels into float32, in one pass: what torch computes
 * in three (the cast, the subtraction, the division), with the same float32 operations on each
 * value, so bit for bit the same result. Built by stoker.data.images.fused_normalize with the system C
 * compiler (-O3: the inner loop over 24 values, three pixels to a vector of eight, vectorises)
 * and called through ctypes. Plain C, no Python headers.
 *
 * Not built with -ffast-math: the division must stay a correctly rounded division.
 */

/* out[3p + c] = ((float)in[3p + c] - mean[c]) / std[c] for the pixels p < pixels. */
void stoker_normalize_rgb(const unsigned char *in, float *out, long pixels, const float *mean, const float *std) {
  float m[24], s[24];
  long i, k, n = pixels * 3, whole = n - n % 24;
  for (k = 0; k < 24; k++) { /* the channel pattern repeats every 24 values: 8 pixels */
    m[k] = mean[k % 3];
    s[k] = std[k % 3];
  }
  for (i = 0; i < whole; i += 24)
    for (k = 0; k < 24; k++) out[i + k] = ((float)in[i + k] - m[k]) / s[k];
  for (; i < n; i++) out[i] = ((float)in[i] - mean[i % 3]) / std[i % 3];
}
