// Times Ceres' evaluation of residuals + Jacobians of the BAL/Snavely reprojection error for every
// observation of a BAL problem, and prints one JSON object on stdout.
//
//   autodiff: AutoDiffCostFunction::Evaluate per observation, the observations split into N
//             contiguous ranges over N std::threads, writing residuals (2), camera Jacobians
//             (2x9 row-major) and point Jacobians (2x3) into preallocated arrays. This is pure
//             automatic-differentiation throughput, the fair peer for a batched AD engine.
//   problem:  ceres::Problem::Evaluate with EvaluateOptions::num_threads = N into a CRSMatrix,
//             which also pays for building the sparse Jacobian's structure on every call.
//
// The checksums (sum of residuals, ½Σr², sum of |J|) let another implementation be checked
// against the same problem; they are summed in observation order, so they do not depend on N.
#include <atomic>
#include <iostream>
#include <memory>
#include <thread>

#include "ceres/ceres.h"
#include "glog/logging.h"
#include "peer_common.h"
#include "snavely_reprojection_error.h"

namespace pyclad_peers {
namespace {

const char kUsage[] =
    "usage: ceres_jacobian --input=problem.txt[.bz2] [--threads=1] [--repeat=10] [--warmup=2]\n"
    "                      [--mode=both|autodiff|problem]\n"
    "Times residual + Jacobian evaluation of the Snavely reprojection error over every\n"
    "observation and prints one JSON object (medians, observations per second, checksums).\n";

struct Outputs {
  std::vector<double> residuals, jac_camera, jac_point;
};

JsonObject Checksum(const Outputs& out) {
  double rsum = 0, cost = 0, jc = 0, jp = 0;
  for (double r : out.residuals) {
    rsum += r;
    cost += 0.5 * r * r;
  }
  for (double v : out.jac_camera) jc += std::fabs(v);
  for (double v : out.jac_point) jp += std::fabs(v);
  JsonObject o;
  o.Num("residual_sum", rsum)
      .Num("cost", cost)
      .Num("abs_jacobian_sum", jc + jp)
      .Num("abs_jacobian_camera_sum", jc)
      .Num("abs_jacobian_point_sum", jp);
  return o;
}

JsonObject TimeAutodiff(BalProblem& bal, int threads, int warmup, int repeat) {
  const size_t m = bal.num_observations;
  std::vector<std::unique_ptr<ceres::CostFunction>> costs(m);
  for (size_t i = 0; i < m; ++i)
    costs[i].reset(SnavelyReprojectionError::Create(bal.observations[2 * i], bal.observations[2 * i + 1]));
  Outputs out;
  out.residuals.assign(2 * m, 0.0);
  out.jac_camera.assign(18 * m, 0.0);
  out.jac_point.assign(6 * m, 0.0);
  std::atomic<long> failures{0};

  auto evaluate_range = [&](size_t begin, size_t end) {
    long failed = 0;
    for (size_t i = begin; i < end; ++i) {
      const double* params[2] = {bal.camera(bal.camera_index[i]), bal.point(bal.point_index[i])};
      double* jacobians[2] = {&out.jac_camera[18 * i], &out.jac_point[6 * i]};
      if (!costs[i]->Evaluate(params, &out.residuals[2 * i], jacobians)) ++failed;
    }
    failures += failed;
  };
  auto evaluate_all = [&]() {
    const size_t chunk = (m + threads - 1) / threads;
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
      const size_t begin = std::min(m, t * chunk), end = std::min(m, (t + 1) * chunk);
      pool.emplace_back(evaluate_range, begin, end);
    }
    evaluate_range(0, std::min(m, chunk));  // the calling thread takes the first range
    for (auto& th : pool) th.join();
  };

  for (int w = 0; w < warmup; ++w) evaluate_all();
  std::vector<double> samples;
  for (int r = 0; r < repeat; ++r) {
    const double t0 = Seconds();
    evaluate_all();
    samples.push_back(Seconds() - t0);
  }
  JsonObject o = TimingJson(samples, static_cast<long>(m));
  o.Num("failed_evaluations", failures.load()).Raw("checksum", Checksum(out).Encode("    "));
  return o;
}

JsonObject TimeProblem(BalProblem& bal, int threads, int warmup, int repeat) {
  const size_t m = bal.num_observations;
  ceres::Problem problem;
  for (size_t i = 0; i < m; ++i)
    problem.AddResidualBlock(SnavelyReprojectionError::Create(bal.observations[2 * i], bal.observations[2 * i + 1]),
                             nullptr, bal.camera(bal.camera_index[i]), bal.point(bal.point_index[i]));
  ceres::Problem::EvaluateOptions options;
  options.num_threads = threads;
  double cost = 0;
  std::vector<double> residuals;
  ceres::CRSMatrix jacobian;
  bool ok = true;
  auto evaluate = [&]() { ok = problem.Evaluate(options, &cost, &residuals, nullptr, &jacobian) && ok; };

  for (int w = 0; w < warmup; ++w) evaluate();
  std::vector<double> samples;
  for (int r = 0; r < repeat; ++r) {
    const double t0 = Seconds();
    evaluate();
    samples.push_back(Seconds() - t0);
  }
  if (!ok) throw PeerError("ceres::Problem::Evaluate failed");
  double rsum = 0, jsum = 0;
  for (double v : residuals) rsum += v;
  for (double v : jacobian.values) jsum += std::fabs(v);
  JsonObject checksum;
  checksum.Num("residual_sum", rsum).Num("cost", cost).Num("abs_jacobian_sum", jsum);
  JsonObject o = TimingJson(samples, static_cast<long>(m));
  o.Num("jacobian_rows", jacobian.num_rows)
      .Num("jacobian_cols", jacobian.num_cols)
      .Num("jacobian_nnz", static_cast<long>(jacobian.values.size()))
      .Raw("checksum", checksum.Encode("    "));
  return o;
}

int Main(int argc, char** argv) {
  Args args(argc, argv, {{"input", ""}, {"threads", "1"}, {"repeat", "10"}, {"warmup", "2"}, {"mode", "both"}});
  if (args.help()) {
    std::cout << kUsage;
    return 0;
  }
  if (args.Str("input").empty()) throw PeerError(std::string("--input is required\n") + kUsage);
  const int threads = args.Int("threads", 1, 1024);
  const int repeat = args.Int("repeat", 1, 100000);
  const int warmup = args.Int("warmup", 0, 100000);
  const std::string mode = args.OneOf("mode", {"both", "autodiff", "problem"});

  const double t0 = Seconds();
  BalProblem bal = LoadBal(args.Str("input"));
  const double load_s = Seconds() - t0;

  JsonObject result;
  result.Str("peer", "ceres_jacobian")
      .Str("ceres_version", CeresVersion())
      .Str("input", args.Str("input"))
      .Num("num_cameras", bal.num_cameras)
      .Num("num_points", bal.num_points)
      .Num("num_observations", bal.num_observations)
      .Num("threads", threads)
      .Num("hardware_threads", static_cast<int>(std::thread::hardware_concurrency()))
      .Num("warmup", warmup)
      .Num("repeat", repeat)
      .Num("load_s", load_s);
  if (mode != "problem") result.Raw("autodiff", TimeAutodiff(bal, threads, warmup, repeat).Encode("  "));
  if (mode != "autodiff") result.Raw("problem", TimeProblem(bal, threads, warmup, repeat).Encode("  "));
  std::cout << result.Encode() << std::endl;
  return 0;
}

}  // namespace
}  // namespace pyclad_peers

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  try {
    return pyclad_peers::Main(argc, argv);
  } catch (const pyclad_peers::PeerError& e) {
    std::cerr << "ceres_jacobian: " << e.what() << std::endl;
    return 2;
  }
}
