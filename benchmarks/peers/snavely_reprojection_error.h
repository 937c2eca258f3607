// The standard BAL / Snavely reprojection error, the cost Ceres' own bundle_adjuster examples use.
//
// Camera (9 parameters): [w(3) angle-axis rotation, t(3) translation, f, k1, k2]; point: X(3).
//   P = R(w) X + t                 (ceres::AngleAxisRotatePoint, which is exact near w = 0)
//   p = -P.xy / P.z                (Bundler cameras look down -z)
//   r = 1 + k1 |p|^2 + k2 |p|^4    (radial distortion)
//   residual = f r p - observed    (2 values)
#ifndef PYCLAD_PEERS_SNAVELY_REPROJECTION_ERROR_H_
#define PYCLAD_PEERS_SNAVELY_REPROJECTION_ERROR_H_

#include "ceres/autodiff_cost_function.h"
#include "ceres/rotation.h"

namespace pyclad_peers {

struct SnavelyReprojectionError {
  SnavelyReprojectionError(double observed_x, double observed_y)
      : observed_x(observed_x), observed_y(observed_y) {}

  template <typename T>
  bool operator()(const T* const camera, const T* const point, T* residuals) const {
    T p[3];
    ceres::AngleAxisRotatePoint(camera, point, p);
    p[0] += camera[3];
    p[1] += camera[4];
    p[2] += camera[5];

    const T xp = -p[0] / p[2];
    const T yp = -p[1] / p[2];

    const T& k1 = camera[7];
    const T& k2 = camera[8];
    const T r2 = xp * xp + yp * yp;
    const T distortion = 1.0 + r2 * (k1 + k2 * r2);

    const T& focal = camera[6];
    residuals[0] = focal * distortion * xp - observed_x;
    residuals[1] = focal * distortion * yp - observed_y;
    return true;
  }

  // 2 residuals, a 9-parameter camera block and a 3-parameter point block.
  using CostFunction = ceres::AutoDiffCostFunction<SnavelyReprojectionError, 2, 9, 3>;

  static CostFunction* Create(double observed_x, double observed_y) {
    return new CostFunction(new SnavelyReprojectionError(observed_x, observed_y));
  }

  double observed_x;
  double observed_y;
};

}  // namespace pyclad_peers

#endif  // PYCLAD_PEERS_SNAVELY_REPROJECTION_ERROR_H_
