// Solves a BAL problem with Ceres (Levenberg-Marquardt, Schur-complement linear solvers), in the
// spirit of Ceres' examples/bundle_adjuster.cc but without its preprocessing: the problem is
// solved as stored (no normalisation, no perturbation, no user ordering; Ceres' automatic Schur
// ordering eliminates the points). Prints one JSON object on stdout (costs, iterations,
// termination, time split, per-iteration history) and Ceres' FullReport on stderr.
#include <fstream>
#include <iostream>
#include <memory>

#include "ceres/ceres.h"
#include "glog/logging.h"
#include "peer_common.h"
#include "snavely_reprojection_error.h"

namespace pyclad_peers {
namespace {

const char kUsage[] =
    "usage: ceres_bundle_adjuster --input=problem.txt[.bz2]\n"
    "  [--linear_solver=sparse_schur|iterative_schur|dense_schur]   (sparse_schur)\n"
    "  [--preconditioner=schur_jacobi|jacobi|identity]               (schur_jacobi; iterative_schur only)\n"
    "  [--sparse_linear_algebra_library=suite_sparse|eigen_sparse]  (suite_sparse)\n"
    "  [--max_iterations=50] [--function_tolerance=1e-6] [--gradient_tolerance=1e-10]\n"
    "  [--parameter_tolerance=1e-8] [--num_threads=1] [--jacobi_scaling=true]\n"
    "  [--loss=none|huber|cauchy|soft_l1] [--loss_scale=1.0] [--final_parameters=FILE]\n"
    "Prints one JSON object on stdout and Ceres' FullReport on stderr.\n";

ceres::LossFunction* MakeLoss(const std::string& loss, double scale) {
  if (loss == "huber") return new ceres::HuberLoss(scale);
  if (loss == "cauchy") return new ceres::CauchyLoss(scale);
  if (loss == "soft_l1") return new ceres::SoftLOneLoss(scale);
  return nullptr;  // "none": plain squared error
}

template <typename Enum>
Enum ParseEnum(const Args& args, const std::string& key, const std::vector<std::string>& allowed,
               bool (*from_string)(std::string, Enum*)) {
  Enum value;
  std::string name = args.OneOf(key, allowed);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  if (!from_string(name, &value)) throw PeerError("--" + key + ": Ceres does not know " + name);
  return value;
}

// "2.1.0-eigen-(3.4.0)-lapack-suitesparse-(5.12.0)-..." from the FullReport's first line, if present.
std::string BuildString(const std::string& report) {
  const std::string tag = "Solver Summary (v ";
  const size_t at = report.find(tag);
  if (at == std::string::npos) return "";
  const size_t eol = report.find('\n', at);
  std::string line = report.substr(at + tag.size(), eol == std::string::npos ? std::string::npos : eol - at - tag.size());
  if (!line.empty() && line.back() == ')') line.pop_back();
  return line;
}

std::string IntArray(const std::vector<int>& v) {
  std::vector<std::string> enc;
  for (int x : v) enc.push_back(std::to_string(x));
  return JsonArray(enc);
}

JsonObject IterationJson(const ceres::IterationSummary& it) {
  JsonObject o;
  o.Num("iteration", it.iteration)
      .Num("cost", it.cost)
      .Num("cost_change", it.cost_change)
      .Num("gradient_max_norm", it.gradient_max_norm)
      .Num("step_norm", it.step_norm)
      .Num("relative_decrease", it.relative_decrease)
      .Num("trust_region_radius", it.trust_region_radius)
      .Bool("step_is_successful", it.step_is_successful)
      .Num("linear_solver_iterations", it.linear_solver_iterations)
      .Num("iteration_time_s", it.iteration_time_in_seconds)
      .Num("cumulative_time_s", it.cumulative_time_in_seconds);
  return o;
}

int Main(int argc, char** argv) {
  Args args(argc, argv,
            {{"input", ""},
             {"linear_solver", "sparse_schur"},
             {"preconditioner", "schur_jacobi"},
             {"sparse_linear_algebra_library", "suite_sparse"},
             {"max_iterations", "50"},
             {"function_tolerance", "1e-6"},
             {"gradient_tolerance", "1e-10"},
             {"parameter_tolerance", "1e-8"},
             {"num_threads", "1"},
             {"jacobi_scaling", "true"},
             {"loss", "none"},
             {"loss_scale", "1.0"},
             {"final_parameters", ""}});
  if (args.help()) {
    std::cout << kUsage;
    return 0;
  }
  if (args.Str("input").empty()) throw PeerError(std::string("--input is required\n") + kUsage);

  ceres::Solver::Options options;
  options.minimizer_type = ceres::TRUST_REGION;
  options.trust_region_strategy_type = ceres::LEVENBERG_MARQUARDT;
  options.linear_solver_type = ParseEnum<ceres::LinearSolverType>(
      args, "linear_solver", {"sparse_schur", "iterative_schur", "dense_schur"}, ceres::StringToLinearSolverType);
  options.preconditioner_type = ParseEnum<ceres::PreconditionerType>(
      args, "preconditioner", {"schur_jacobi", "jacobi", "identity"}, ceres::StringToPreconditionerType);
  options.sparse_linear_algebra_library_type = ParseEnum<ceres::SparseLinearAlgebraLibraryType>(
      args, "sparse_linear_algebra_library", {"suite_sparse", "eigen_sparse"},
      ceres::StringToSparseLinearAlgebraLibraryType);
  options.max_num_iterations = args.Int("max_iterations", 0, 1000000);
  options.function_tolerance = args.Double("function_tolerance", 0.0);
  options.gradient_tolerance = args.Double("gradient_tolerance", 0.0);
  options.parameter_tolerance = args.Double("parameter_tolerance", 0.0);
  options.num_threads = args.Int("num_threads", 1, 1024);
  options.jacobi_scaling = args.Bool("jacobi_scaling");
  options.minimizer_progress_to_stdout = false;  // stdout carries the JSON only
  options.logging_type = ceres::SILENT;
  const std::string loss = args.OneOf("loss", {"none", "huber", "cauchy", "soft_l1"});
  const double loss_scale = args.Double("loss_scale", 0.0);
  if (loss != "none" && !(loss_scale > 0)) throw PeerError("--loss_scale must be > 0 with a robust loss");
  std::string invalid;
  if (!options.IsValid(&invalid)) throw PeerError("invalid solver options: " + invalid);

  double t0 = Seconds();
  BalProblem bal = LoadBal(args.Str("input"));
  const double load_s = Seconds() - t0;

  t0 = Seconds();
  ceres::Problem problem;
  for (int i = 0; i < bal.num_observations; ++i)
    problem.AddResidualBlock(SnavelyReprojectionError::Create(bal.observations[2 * i], bal.observations[2 * i + 1]),
                             MakeLoss(loss, loss_scale), bal.camera(bal.camera_index[i]),
                             bal.point(bal.point_index[i]));
  const double setup_s = Seconds() - t0;

  ceres::Solver::Summary summary;
  t0 = Seconds();
  ceres::Solve(options, &problem, &summary);
  const double solve_wall_s = Seconds() - t0;
  const std::string report = summary.FullReport();
  std::cerr << report << std::endl;

  if (!args.Str("final_parameters").empty()) {
    std::ofstream f(args.Str("final_parameters"));
    if (!f) throw PeerError("--final_parameters: cannot write " + args.Str("final_parameters"));
    char buf[32];
    for (double v : bal.parameters) {
      std::snprintf(buf, sizeof buf, "%.17g\n", v);
      f << buf;
    }
  }

  JsonObject opts;
  opts.Str("linear_solver", ceres::LinearSolverTypeToString(options.linear_solver_type))
      .Str("preconditioner", ceres::PreconditionerTypeToString(options.preconditioner_type))
      .Str("sparse_linear_algebra_library",
           ceres::SparseLinearAlgebraLibraryTypeToString(options.sparse_linear_algebra_library_type))
      .Str("trust_region_strategy", ceres::TrustRegionStrategyTypeToString(options.trust_region_strategy_type))
      .Num("max_iterations", options.max_num_iterations)
      .Num("function_tolerance", options.function_tolerance)
      .Num("gradient_tolerance", options.gradient_tolerance)
      .Num("parameter_tolerance", options.parameter_tolerance)
      .Num("num_threads", options.num_threads)
      .Bool("jacobi_scaling", options.jacobi_scaling)
      .Str("loss", loss)
      .Num("loss_scale", loss == "none" ? 0.0 : loss_scale)
      .Str("ordering", "automatic")
      .Num("initial_trust_region_radius", options.initial_trust_region_radius)
      .Num("eta", options.eta)
      .Num("max_linear_solver_iterations", options.max_linear_solver_iterations);

  JsonObject iterations;
  // Ceres counts iteration 0 (the initial evaluation) as a successful minimizer iteration;
  // "steps" is the number of trust-region steps tried after it.
  const int minimizer_iterations = static_cast<int>(summary.iterations.size());
  iterations.Num("successful", summary.num_successful_steps)
      .Num("unsuccessful", summary.num_unsuccessful_steps)
      .Num("minimizer_iterations", minimizer_iterations)
      .Num("steps", std::max(0, minimizer_iterations - 1));

  JsonObject termination;
  termination.Str("type", ceres::TerminationTypeToString(summary.termination_type))
      .Str("message", summary.message)
      .Bool("usable", summary.IsSolutionUsable());

  JsonObject times;
  times.Num("load_s", load_s)
      .Num("setup_s", setup_s)
      .Num("solve_wall_s", solve_wall_s)
      .Num("total_s", summary.total_time_in_seconds)
      .Num("preprocessor_s", summary.preprocessor_time_in_seconds)
      .Num("minimizer_s", summary.minimizer_time_in_seconds)
      .Num("postprocessor_s", summary.postprocessor_time_in_seconds)
      .Num("jacobian_evaluation_s", summary.jacobian_evaluation_time_in_seconds)
      .Num("num_jacobian_evaluations", summary.num_jacobian_evaluations)
      .Num("residual_evaluation_s", summary.residual_evaluation_time_in_seconds)
      .Num("num_residual_evaluations", summary.num_residual_evaluations)
      .Num("linear_solver_s", summary.linear_solver_time_in_seconds)
      .Num("num_linear_solves", summary.num_linear_solves);

  std::vector<std::string> history;
  for (const auto& it : summary.iterations) history.push_back(IterationJson(it).Encode("    "));

  JsonObject result;
  result.Str("peer", "ceres_bundle_adjuster")
      .Str("ceres_version", CeresVersion())
      .Str("ceres_build", BuildString(report))
      .Str("input", args.Str("input"))
      .Num("num_cameras", bal.num_cameras)
      .Num("num_points", bal.num_points)
      .Num("num_observations", bal.num_observations)
      .Raw("options", opts.Encode("  "))
      .Num("initial_cost", summary.initial_cost)
      .Num("final_cost", summary.final_cost)
      .Raw("iterations", iterations.Encode("  "))
      .Raw("termination", termination.Encode("  "))
      .Raw("times", times.Encode("  "))
      .Num("num_threads", summary.num_threads_used)
      .Str("linear_solver_used", ceres::LinearSolverTypeToString(summary.linear_solver_type_used))
      .Str("preconditioner_used", ceres::PreconditionerTypeToString(summary.preconditioner_type_used))
      .Raw("linear_solver_ordering_used", IntArray(summary.linear_solver_ordering_used))
      .Str("schur_structure_used", summary.schur_structure_used)
      .Raw("history", JsonArray(history));
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
    std::cerr << "ceres_bundle_adjuster: " << e.what() << std::endl;
    return 2;
  }
}
