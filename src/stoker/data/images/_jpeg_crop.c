/*
 * Decode only a window of a JPEG: libjpeg-turbo's partial decompression (jpeg_crop_scanline for
 * the columns, jpeg_skip_scanlines for the rows above, stopping after the last row needed) at a
 * DCT scale of 1/1, 1/2, 1/4 or 1/8, with the fast integer IDCT and plain upsampling, as
 * TensorFlow's decode_and_crop_jpeg does. Built by stoker.data.images.jpeg_crop with the system C
 * compiler against the system libjpeg (libjpeg-turbo >= 1.5.1) and called through ctypes: a plain
 * C interface, no Python headers, so one build serves every Python.
 *
 * Errors: libjpeg's fatal errors return through longjmp; its warnings (corrupt or truncated data
 * in what was decoded) are errors too, as simplejpeg's strict mode makes them.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define STOKER_OK 0
#define STOKER_ERROR 1       /* err holds libjpeg's message */
#define STOKER_UNSUPPORTED 2 /* CMYK/YCCK: the caller decodes it another way */
#define STOKER_BAD_ARGUMENT 3

struct stoker_error_mgr {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  int warned;
  char message[JMSG_LENGTH_MAX];
};

static void stoker_error_exit(j_common_ptr cinfo) {
  struct stoker_error_mgr *err = (struct stoker_error_mgr *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

static void stoker_emit_message(j_common_ptr cinfo, int msg_level) {
  struct stoker_error_mgr *err = (struct stoker_error_mgr *)cinfo->err;
  if (msg_level < 0 && !err->warned) { /* a warning: keep the first one's text */
    err->warned = 1;
    (*cinfo->err->format_message)(cinfo, err->message);
  }
}

static void copy_message(const char *message, char *err, int err_len) {
  if (err != NULL && err_len > 0) {
    strncpy(err, message, (size_t)err_len - 1);
    err[err_len - 1] = '\0';
  }
}

/*
 * Error handling, then the header read: a macro, not a function, because setjmp must be called
 * in the frame that libjpeg's error_exit longjmps back to (locals changed after it are not read
 * on that path, so -Wclobbered's warnings do not apply). On a libjpeg error the calling
 * function returns STOKER_ERROR with the message in err.
 */
#define OPEN_JPEG(cinfo, jerr, data, size, err, err_len) \
  do {                                                   \
    (cinfo).err = jpeg_std_error(&(jerr).pub);           \
    (jerr).pub.error_exit = stoker_error_exit;           \
    (jerr).pub.emit_message = stoker_emit_message;       \
    (jerr).warned = 0;                                   \
    if (setjmp((jerr).jump)) {                           \
      copy_message((jerr).message, err, err_len);        \
      jpeg_destroy_decompress(&(cinfo));                 \
      return STOKER_ERROR;                               \
    }                                                    \
    jpeg_create_decompress(&(cinfo));                    \
    jpeg_mem_src(&(cinfo), data, size);                  \
    jpeg_read_header(&(cinfo), TRUE);                    \
  } while (0)

/* The image's size (width, height) at full scale; 0 or an error code. */
int stoker_jpeg_size(const unsigned char *data, unsigned long size, int *width, int *height, char *err,
                     int err_len) {
  struct jpeg_decompress_struct cinfo;
  struct stoker_error_mgr jerr;
  OPEN_JPEG(cinfo, jerr, data, size, err, err_len);
  *width = (int)cinfo.image_width;
  *height = (int)cinfo.image_height;
  jpeg_destroy_decompress(&cinfo);
  return STOKER_OK;
}

/*
 * Decode the window (x, y, w, h) of the image scaled by 1/scale_denom (coordinates in scaled
 * pixels, clipped to the scaled image) into out: RGB, rows of out_stride bytes, at least
 * h * out_stride bytes. *out_w and *out_h receive the window's size after clipping.
 */
int stoker_jpeg_decode_window(const unsigned char *data, unsigned long size, int scale_denom, int x, int y, int w,
                              int h, unsigned char *out, long out_stride, long out_capacity, int *out_w,
                              int *out_h, char *err, int err_len) {
  struct jpeg_decompress_struct cinfo;
  struct stoker_error_mgr jerr;
  JSAMPARRAY rows = NULL;
  JSAMPLE *wide = NULL;
  JDIMENSION xoff, cw, width, height, bottom, skipped, r;
  int direct;
  if (scale_denom != 1 && scale_denom != 2 && scale_denom != 4 && scale_denom != 8) {
    copy_message("scale_denom must be 1, 2, 4 or 8", err, err_len);
    return STOKER_BAD_ARGUMENT;
  }
  if (x < 0 || y < 0 || w < 1 || h < 1) {
    copy_message("the window must start at x, y >= 0 and be at least 1x1", err, err_len);
    return STOKER_BAD_ARGUMENT;
  }
  OPEN_JPEG(cinfo, jerr, data, size, err, err_len);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return STOKER_UNSUPPORTED;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)scale_denom;
  cinfo.dct_method = JDCT_IFAST;
  cinfo.do_fancy_upsampling = FALSE;
  jpeg_start_decompress(&cinfo);
  width = cinfo.output_width;
  height = cinfo.output_height;
  if ((JDIMENSION)x >= width || (JDIMENSION)y >= height) {
    jpeg_destroy_decompress(&cinfo);
    copy_message("the window starts outside the image", err, err_len);
    return STOKER_BAD_ARGUMENT;
  }
  if ((JDIMENSION)(x + w) > width) w = (int)(width - (JDIMENSION)x);
  if ((JDIMENSION)(y + h) > height) h = (int)(height - (JDIMENSION)y);
  if (out_stride < 3L * w || out_capacity < out_stride * h) {
    jpeg_destroy_decompress(&cinfo);
    copy_message("the output buffer is too small for the window", err, err_len);
    return STOKER_BAD_ARGUMENT;
  }
  /* Columns: libjpeg widens the window to whole iMCUs (xoff down, cw up). */
  xoff = (JDIMENSION)x;
  cw = (JDIMENSION)w;
  if (xoff > 0 || cw < width) jpeg_crop_scanline(&cinfo, &xoff, &cw);
  /* Many rows per jpeg_read_scanlines call, as TurboJPEG does: one row per call costs the merged
   * upsampler a spare-row copy and ran at 0.71x (570 against 806 full 500x375 decodes a second,
   * one core, 2026-11-26). Rows land in out
   * directly when the widened window is the window; else in a buffer cw wide, copied after. */
  direct = xoff == (JDIMENSION)x && cw == (JDIMENSION)w;
  rows = (JSAMPARRAY)(*cinfo.mem->alloc_small)((j_common_ptr)&cinfo, JPOOL_IMAGE, sizeof(JSAMPROW) * (size_t)h);
  if (!direct)
    wide = (JSAMPLE *)(*cinfo.mem->alloc_large)((j_common_ptr)&cinfo, JPOOL_IMAGE, (size_t)cw * 3 * (size_t)h);
  for (r = 0; r < (JDIMENSION)h; r++)
    rows[r] = direct ? out + (long)r * out_stride : wide + (size_t)r * cw * 3;
  if (y > 0) {
    skipped = jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
    if (skipped != (JDIMENSION)y && !jerr.warned) {
      jerr.warned = 1;
      strcpy(jerr.message, "fewer scanlines than the header says");
    }
  }
  bottom = (JDIMENSION)(y + h);
  while (cinfo.output_scanline < bottom) {
    JDIMENSION done = cinfo.output_scanline - (JDIMENSION)y;
    if (jpeg_read_scanlines(&cinfo, rows + done, bottom - cinfo.output_scanline) == 0) break;
  }
  if (!direct)
    for (r = 0; r < (JDIMENSION)h; r++)
      memcpy(out + (long)r * out_stride, wide + (size_t)r * cw * 3 + ((JDIMENSION)x - xoff) * 3, (size_t)w * 3);
  if (cinfo.output_scanline < bottom && !jerr.warned) {
    jerr.warned = 1;
    strcpy(jerr.message, "fewer scanlines than the header says");
  }
  /* Rows below the window are never decoded: stop here (jpeg_finish_decompress would read them). */
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (jerr.warned) {
    copy_message(jerr.message, err, err_len);
    return STOKER_ERROR;
  }
  *out_w = w;
  *out_h = h;
  return STOKER_OK;
}
