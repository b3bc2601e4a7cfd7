/* Figures of image regression, for validation of models trained on
 * patches (val_psnr, val_ssim; docs/design.md, "Image-to-image models").
 *
 * PSNR is 10 log10(range^2 / mse), from the validation mse over every
 * value of every patch (the loss), range 1 for the patches' [0, 1] scale.
 * SSIM is Wang, Bovik, Sheikh and Simoncelli's (2004) as their reference
 * code and MATLAB's ssim compute it: an 11 x 11 Gaussian window of sigma
 * 1.5, K1 = 0.01, K2 = 0.03, C1 = (K1 L)^2, C2 = (K2 L)^2, the map over
 * the positions where the window lies inside the image ("valid"), its
 * mean over positions and channels.  On images smaller than 11 pixels the
 * window is cut to the largest odd side that fits. */
#ifndef TR_IMAGE_METRICS_H
#define TR_IMAGE_METRICS_H

double tr_psnr(double mse, double range);

/* a and b planar [c][h][w]; range the data range L. */
double tr_ssim(const float *a, const float *b, int c, int h, int w, double range);

#endif
