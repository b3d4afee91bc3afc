// Every torch::nn layer family, forward and backward: traced on a fake cpu
// to the byte of the real CPU run, and traced on a fake cuda.
#include <gtest/gtest.h>
#include <torch/nn.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "meta/MetaMode.h"
#include "profiler/Step.h"
#include "tests/KnownGaps.h"

namespace metamem {
namespace {

namespace nn = torch::nn;
namespace F = torch::nn::functional;

struct LayerCase {
  std::string name;
  StepBuilder build;
};

void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// A layer built in the step (its parameters on the traced device) and a
// loss over its output for random inputs that need gradients.
template <class Holder>
LayerCase layer(std::string name, std::function<Holder()> make, std::function<at::Tensor(Holder&)> loss) {
  struct Step final : TrainingStep {
    Holder module{nullptr};
    std::function<at::Tensor(Holder&)> loss;
    at::Tensor forward_loss() override { return loss(module); }
    std::vector<at::Tensor> parameters() override { return module->parameters(); }
  };
  return {std::move(name), [make, loss] {
            auto step = std::make_unique<Step>();
            torch::manual_seed(0);
            step->module = make();
            step->loss = loss;
            return step;
          }};
}

// A function of inputs alone (losses, functional forms).
LayerCase function(std::string name, std::function<at::Tensor()> loss) {
  return layer<nn::Identity>(std::move(name), [] { return nn::Identity(); },
                             [loss](nn::Identity&) { return loss(); });
}

at::Tensor input(at::IntArrayRef size) { return torch::randn(size, torch::requires_grad()); }

// A module made from `options`, applied to one random input of `size`.
template <class Module, class Options>
LayerCase applied(std::string name, Options options, std::vector<std::int64_t> size) {
  return layer<Module>(std::move(name), [options] { return Module(options); },
                       [size](Module& m) { return m(input(size)).sum(); });
}

// A lookup table made from `options` (weights in `dtype`), applied to random
// indices of `size` below `rows`.
template <class Module, class Options>
LayerCase lookup(std::string name, Options options, std::int64_t rows, std::vector<std::int64_t> size,
                 c10::ScalarType dtype = torch::kFloat) {
  return layer<Module>(std::move(name),
                       [options, dtype] {
                         Module m(options);
                         if (dtype != torch::kFloat) m->to(dtype);
                         return m;
                       },
                       [rows, size](Module& m) { return m(torch::randint(rows, size)).sum(); });
}

// One training step's peak on fake cpu and on fake cuda, and the real CPU run's.
struct Peaks {
  std::int64_t predicted, achieved, fake_cuda;
};

Peaks peaks_of(const StepBuilder& build) {
  StepOptions one_step;
  one_step.steps = 1;
  return {trace_step(build, c10::Device(c10::kCPU), one_step).measured().peak_bytes,
          achieved_cpu_step_peaks(build, one_step).back(),
          trace_step(build, c10::Device(c10::kCUDA), one_step).measured().peak_bytes};
}

class Layer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(Layer, TracedPeakIsTheRealCpuRunsAndFakeCudaTraces) {
  Peaks peaks{};
  if (!testing::traces_past_known_gaps([&] { peaks = peaks_of(GetParam().build); })) return;
  RecordProperty("achieved", std::to_string(peaks.achieved));
  testing::expect_cpu_parity(peaks.predicted, peaks.achieved);
  EXPECT_GT(peaks.fake_cuda, 0);
}

std::string case_name(const ::testing::TestParamInfo<LayerCase>& info) { return info.param.name; }

// ---- convolutions ----------------------------------------------------------

std::vector<LayerCase> convolutions() {
  using O1 = nn::Conv1dOptions;
  using O2 = nn::Conv2dOptions;
  using O3 = nn::Conv3dOptions;
  using T1 = nn::ConvTranspose1dOptions;
  using T2 = nn::ConvTranspose2dOptions;
  using T3 = nn::ConvTranspose3dOptions;
  return {
      applied<nn::Conv1d>("conv1d", O1(4, 6, 3), {2, 4, 16}),
      applied<nn::Conv1d>("conv1d_no_bias_stride_pad", O1(4, 6, 3).bias(false).stride(2).padding(1), {2, 4, 16}),
      applied<nn::Conv1d>("conv1d_dilation", O1(4, 6, 3).dilation(2), {2, 4, 16}),
      applied<nn::Conv1d>("conv1d_groups", O1(4, 6, 3).groups(2), {2, 4, 16}),
      applied<nn::Conv1d>("conv1d_reflect", O1(4, 6, 3).padding(1).padding_mode(torch::kReflect), {2, 4, 16}),
      applied<nn::Conv1d>("conv1d_circular", O1(4, 6, 3).padding(1).padding_mode(torch::kCircular), {2, 4, 16}),
      applied<nn::Conv2d>("conv2d", O2(3, 8, 3), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_stride_pad", O2(3, 8, 3).stride(2).padding(1), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_pointwise", O2(3, 8, 1), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_dilation", O2(3, 8, 3).dilation(2), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_groups", O2(4, 8, 3).groups(2), {2, 4, 12, 12}),
      applied<nn::Conv2d>("conv2d_depthwise", O2(4, 4, 3).groups(4).padding(1), {2, 4, 12, 12}),
      applied<nn::Conv2d>("conv2d_groups_dilation", O2(4, 8, 3).groups(2).dilation(2), {2, 4, 12, 12}),
      applied<nn::Conv2d>("conv2d_reflect", O2(3, 8, 3).padding(1).padding_mode(torch::kReflect), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_replicate", O2(3, 8, 3).padding(1).padding_mode(torch::kReplicate), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_circular", O2(3, 8, 3).padding(1).padding_mode(torch::kCircular), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_same", O2(3, 8, 3).padding(torch::kSame), {2, 3, 12, 12}),
      applied<nn::Conv2d>("conv2d_batch_of_one", O2(3, 8, 3), {1, 3, 12, 12}),
      layer<nn::Conv2d>("conv2d_channels_last_input", [] { return nn::Conv2d(O2(8, 16, 2).stride(2)); },
                        [](nn::Conv2d& m) {
                          return m(input({2, 8, 12, 12}).contiguous(at::MemoryFormat::ChannelsLast)).sum();
                        }),
      applied<nn::Conv3d>("conv3d", O3(2, 4, 3), {2, 2, 6, 6, 6}),
      applied<nn::Conv3d>("conv3d_stride_groups", O3(4, 4, 3).stride(2).groups(2).padding(1), {2, 4, 6, 6, 6}),
      applied<nn::Conv3d>("conv3d_dilation", O3(2, 4, 2).dilation(2), {2, 2, 6, 6, 6}),
      applied<nn::ConvTranspose1d>("conv_transpose1d", T1(4, 6, 3), {2, 4, 8}),
      applied<nn::ConvTranspose1d>("conv_transpose1d_stride_output_padding", T1(4, 6, 3).stride(2).output_padding(1),
                                {2, 4, 8}),
      applied<nn::ConvTranspose2d>("conv_transpose2d", T2(3, 6, 3), {2, 3, 6, 6}),
      applied<nn::ConvTranspose2d>("conv_transpose2d_groups", T2(4, 6, 3).groups(2).stride(2), {2, 4, 6, 6}),
      applied<nn::ConvTranspose2d>("conv_transpose2d_dilation", T2(3, 6, 3).dilation(2).bias(false), {2, 3, 6, 6}),
      applied<nn::ConvTranspose3d>("conv_transpose3d", T3(2, 4, 3), {2, 2, 4, 4, 4}),
      applied<nn::ConvTranspose3d>("conv_transpose3d_groups", T3(4, 4, 2).groups(2).stride(2), {2, 4, 4, 4, 4}),
  };
}

INSTANTIATE_TEST_SUITE_P(Convolution, Layer, ::testing::ValuesIn(convolutions()), case_name);

// ---- normalization -------------------------------------------------------

template <class Norm, class Options>
LayerCase norm(std::string name, Options options, std::vector<std::int64_t> size, bool eval = false) {
  return layer<Norm>(std::move(name),
                     [options, eval] {
                       Norm m(options);
                       if (eval) m->eval();
                       return m;
                     },
                     [size](Norm& m) { return m(input(size)).sum(); });
}

std::vector<LayerCase> normalizations() {
  return {
      norm<nn::BatchNorm1d>("batch_norm1d_2d", nn::BatchNorm1dOptions(6), {8, 6}),
      norm<nn::BatchNorm1d>("batch_norm1d_3d", nn::BatchNorm1dOptions(6), {4, 6, 10}),
      norm<nn::BatchNorm2d>("batch_norm2d", nn::BatchNorm2dOptions(6), {4, 6, 8, 8}),
      norm<nn::BatchNorm2d>("batch_norm2d_eval", nn::BatchNorm2dOptions(6), {4, 6, 8, 8}, true),
      norm<nn::BatchNorm2d>("batch_norm2d_no_affine", nn::BatchNorm2dOptions(6).affine(false), {4, 6, 8, 8}),
      norm<nn::BatchNorm2d>("batch_norm2d_no_running_stats", nn::BatchNorm2dOptions(6).track_running_stats(false),
                            {4, 6, 8, 8}),
      norm<nn::BatchNorm3d>("batch_norm3d", nn::BatchNorm3dOptions(4), {2, 4, 4, 4, 4}),
      norm<nn::LayerNorm>("layer_norm", nn::LayerNormOptions({16}), {4, 8, 16}),
      norm<nn::LayerNorm>("layer_norm_two_dims", nn::LayerNormOptions({8, 16}), {4, 8, 16}),
      norm<nn::LayerNorm>("layer_norm_no_affine", nn::LayerNormOptions({16}).elementwise_affine(false), {4, 8, 16}),
      norm<nn::GroupNorm>("group_norm", nn::GroupNormOptions(2, 6), {4, 6, 8, 8}),
      norm<nn::GroupNorm>("group_norm_no_affine", nn::GroupNormOptions(3, 6).affine(false), {4, 6, 10}),
      norm<nn::InstanceNorm1d>("instance_norm1d", nn::InstanceNorm1dOptions(6), {4, 6, 10}),
      norm<nn::InstanceNorm2d>("instance_norm2d_affine_running",
                               nn::InstanceNorm2dOptions(6).affine(true).track_running_stats(true), {4, 6, 8, 8}),
      norm<nn::InstanceNorm3d>("instance_norm3d", nn::InstanceNorm3dOptions(4).affine(true), {2, 4, 4, 4, 4}),
      norm<nn::LocalResponseNorm>("local_response_norm", nn::LocalResponseNormOptions(3), {4, 6, 8, 8}),
      norm<nn::LocalResponseNorm>("local_response_norm_3d", nn::LocalResponseNormOptions(3), {4, 6, 10}),
  };
}

INSTANTIATE_TEST_SUITE_P(Normalization, Layer, ::testing::ValuesIn(normalizations()), case_name);

// ---- recurrent ----------------------------------------------------------

template <class Rnn, class Options>
LayerCase rnn(std::string name, Options options, std::vector<std::int64_t> size) {
  return layer<Rnn>(std::move(name), [options] { return Rnn(options); },
                    [size](Rnn& m) { return std::get<0>(m(input(size))).sum(); });
}

std::vector<LayerCase> recurrents() {
  return {
      rnn<nn::RNN>("rnn_tanh", nn::RNNOptions(8, 16), {5, 3, 8}),
      rnn<nn::RNN>("rnn_relu_two_layers", nn::RNNOptions(8, 16).nonlinearity(torch::kReLU).num_layers(2), {5, 3, 8}),
      rnn<nn::LSTM>("lstm", nn::LSTMOptions(8, 16), {5, 3, 8}),
      rnn<nn::LSTM>("lstm_two_layers_bidirectional", nn::LSTMOptions(8, 16).num_layers(2).bidirectional(true),
                    {5, 3, 8}),
      rnn<nn::LSTM>("lstm_batch_first_dropout", nn::LSTMOptions(8, 16).num_layers(2).batch_first(true).dropout(0.5),
                    {3, 5, 8}),
      rnn<nn::LSTM>("lstm_projection", nn::LSTMOptions(8, 16).proj_size(4), {5, 3, 8}),
      rnn<nn::GRU>("gru", nn::GRUOptions(8, 16), {5, 3, 8}),
      rnn<nn::GRU>("gru_bidirectional_batch_first", nn::GRUOptions(8, 16).bidirectional(true).batch_first(true),
                   {3, 5, 8}),
      applied<nn::RNNCell>("rnn_cell", nn::RNNCellOptions(8, 16), {3, 8}),
      layer<nn::LSTMCell>("lstm_cell", [] { return nn::LSTMCell(nn::LSTMCellOptions(8, 16)); },
                          [](nn::LSTMCell& m) { return std::get<0>(m(input({3, 8}))).sum(); }),
      applied<nn::GRUCell>("gru_cell", nn::GRUCellOptions(8, 16), {3, 8}),
  };
}

INSTANTIATE_TEST_SUITE_P(Recurrent, Layer, ::testing::ValuesIn(recurrents()), case_name);

// ---- pooling ----------------------------------------------------------------

std::vector<LayerCase> poolings() {
  return {
      applied<nn::MaxPool1d>("max_pool1d", nn::MaxPool1dOptions(3).stride(2), {2, 4, 17}),
      applied<nn::MaxPool2d>("max_pool2d", nn::MaxPool2dOptions(3).stride(2).padding(1), {2, 4, 12, 12}),
      applied<nn::MaxPool2d>("max_pool2d_ceil_dilation", nn::MaxPool2dOptions(2).ceil_mode(true).dilation(2),
                          {2, 4, 11, 11}),
      applied<nn::MaxPool3d>("max_pool3d", nn::MaxPool3dOptions(2), {2, 2, 6, 6, 6}),
      applied<nn::AvgPool1d>("avg_pool1d", nn::AvgPool1dOptions(3).stride(2), {2, 4, 17}),
      applied<nn::AvgPool2d>("avg_pool2d", nn::AvgPool2dOptions(3).stride(2).padding(1), {2, 4, 12, 12}),
      applied<nn::AvgPool2d>("avg_pool2d_no_pad_count_ceil",
                          nn::AvgPool2dOptions(2).ceil_mode(true).count_include_pad(false), {2, 4, 11, 11}),
      applied<nn::AvgPool3d>("avg_pool3d", nn::AvgPool3dOptions(2), {2, 2, 6, 6, 6}),
      applied<nn::AdaptiveAvgPool1d>("adaptive_avg_pool1d", nn::AdaptiveAvgPool1dOptions(5), {2, 4, 17}),
      applied<nn::AdaptiveAvgPool2d>("adaptive_avg_pool2d", nn::AdaptiveAvgPool2dOptions({3, 5}), {2, 4, 12, 12}),
      applied<nn::AdaptiveAvgPool2d>("adaptive_avg_pool2d_global", nn::AdaptiveAvgPool2dOptions(1), {2, 4, 12, 12}),
      applied<nn::AdaptiveAvgPool3d>("adaptive_avg_pool3d", nn::AdaptiveAvgPool3dOptions(3), {2, 2, 6, 6, 6}),
      applied<nn::AdaptiveMaxPool1d>("adaptive_max_pool1d", nn::AdaptiveMaxPool1dOptions(5), {2, 4, 17}),
      applied<nn::AdaptiveMaxPool2d>("adaptive_max_pool2d", nn::AdaptiveMaxPool2dOptions(3), {2, 4, 12, 12}),
      applied<nn::AdaptiveMaxPool3d>("adaptive_max_pool3d", nn::AdaptiveMaxPool3dOptions(3), {2, 2, 6, 6, 6}),
      applied<nn::LPPool1d>("lp_pool1d", nn::LPPool1dOptions(2, 3), {2, 4, 17}),
      applied<nn::LPPool2d>("lp_pool2d", nn::LPPool2dOptions(2, 3).stride(2), {2, 4, 12, 12}),
      function("max_unpool2d", [] {
        auto [out, indices] = F::max_pool2d_with_indices(input({2, 4, 8, 8}), F::MaxPool2dFuncOptions(2));
        return F::max_unpool2d(out, indices, F::MaxUnpool2dFuncOptions(2)).sum();
      }),
  };
}

INSTANTIATE_TEST_SUITE_P(Pooling, Layer, ::testing::ValuesIn(poolings()), case_name);

// ---- upsampling, embedding, shuffling, folding ------------------------------

LayerCase upsample(std::string name, nn::UpsampleOptions options, std::vector<std::int64_t> size) {
  return applied<nn::Upsample>(std::move(name), options, size);
}

std::vector<LayerCase> resamplings() {
  using U = nn::UpsampleOptions;
  using I = F::InterpolateFuncOptions;
  return {
      upsample("upsample_nearest1d", U().scale_factor(std::vector<double>{2}).mode(torch::kNearest), {2, 3, 8}),
      upsample("upsample_linear1d", U().size(std::vector<std::int64_t>{13}).mode(torch::kLinear), {2, 3, 8}),
      upsample("upsample_nearest2d", U().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearest),
               {2, 3, 6, 6}),
      upsample("upsample_bilinear2d", U().size(std::vector<std::int64_t>{9, 11}).mode(torch::kBilinear),
               {2, 3, 6, 6}),
      upsample("upsample_bilinear2d_align_corners",
               U().scale_factor(std::vector<double>{2, 2}).mode(torch::kBilinear).align_corners(true), {2, 3, 6, 6}),
      upsample("upsample_bicubic2d", U().scale_factor(std::vector<double>{2, 2}).mode(torch::kBicubic),
               {2, 3, 6, 6}),
      upsample("upsample_nearest3d", U().scale_factor(std::vector<double>{2, 2, 2}).mode(torch::kNearest),
               {2, 2, 4, 4, 4}),
      upsample("upsample_trilinear3d", U().size(std::vector<std::int64_t>{5, 6, 7}).mode(torch::kTrilinear),
               {2, 2, 4, 4, 4}),
      function("interpolate_area", [] {
        return F::interpolate(input({2, 3, 12, 12}), I().size(std::vector<std::int64_t>{5, 5}).mode(torch::kArea)).sum();
      }),
      function("interpolate_nearest_exact", [] {
        return F::interpolate(input({2, 3, 6, 6}),
                              I().scale_factor(std::vector<double>{2, 2}).mode(torch::kNearestExact))
            .sum();
      }),
      lookup<nn::Embedding>("embedding", nn::EmbeddingOptions(50, 16), 50, {4, 7}),
      lookup<nn::Embedding>("embedding_padding_idx", nn::EmbeddingOptions(50, 16).padding_idx(0), 50, {4, 7}),
      lookup<nn::Embedding>("embedding_scale_grad_by_freq", nn::EmbeddingOptions(50, 16).scale_grad_by_freq(true),
                            50, {4, 7}),
      lookup<nn::EmbeddingBag>("embedding_bag_sum", nn::EmbeddingBagOptions(50, 16).mode(torch::kSum), 50, {4, 7}),
      lookup<nn::EmbeddingBag>("embedding_bag_sum_padding_idx",
                               nn::EmbeddingBagOptions(50, 16).mode(torch::kSum).padding_idx(1), 50, {4, 7}),
      lookup<nn::EmbeddingBag>("embedding_bag_mean", nn::EmbeddingBagOptions(50, 16), 50, {4, 7}),
      lookup<nn::EmbeddingBag>("embedding_bag_max", nn::EmbeddingBagOptions(50, 16).mode(torch::kMax), 50, {4, 7}),
      lookup<nn::EmbeddingBag>("embedding_bag_max_padding_idx",
                               nn::EmbeddingBagOptions(40, 24).mode(torch::kMax).padding_idx(3), 40, {6, 5}),
      lookup<nn::EmbeddingBag>("embedding_bag_mean_double", nn::EmbeddingBagOptions(30, 8), 30, {3, 9},
                               torch::kDouble),
      // Bags by offsets (2.x no longer reads the first offset to check it is 0).
      layer<nn::EmbeddingBag>(
          "embedding_bag_offsets", [] { return nn::EmbeddingBag(nn::EmbeddingBagOptions(50, 16).mode(torch::kSum)); },
          [](nn::EmbeddingBag& m) { return m(torch::randint(50, {20}), torch::tensor({0, 5, 12}, torch::kLong)).sum(); }),
      applied<nn::PixelShuffle>("pixel_shuffle", nn::PixelShuffleOptions(2), {2, 8, 5, 5}),
      applied<nn::PixelUnshuffle>("pixel_unshuffle", nn::PixelUnshuffleOptions(2), {2, 2, 6, 6}),
      applied<nn::Unfold>("unfold", nn::UnfoldOptions({3, 3}).padding(1), {2, 3, 8, 8}),
      applied<nn::Fold>("fold", nn::FoldOptions({6, 6}, {3, 3}), {2, 27, 16}),
      applied<nn::ReflectionPad2d>("reflection_pad2d", nn::ReflectionPad2dOptions(2), {2, 3, 8, 8}),
      applied<nn::ReplicationPad3d>("replication_pad3d", nn::ReplicationPad3dOptions(1), {2, 2, 4, 4, 4}),
      applied<nn::ZeroPad2d>("zero_pad2d", nn::ZeroPad2dOptions({1, 2, 0, 1}), {2, 3, 8, 8}),
  };
}

INSTANTIATE_TEST_SUITE_P(Resampling, Layer, ::testing::ValuesIn(resamplings()), case_name);

// ---- activations ---------------------------------------------------------

template <class Activation, class... Options>
LayerCase activation(std::string name, Options... options) {
  return layer<Activation>(std::move(name), [options...] { return Activation(options...); },
                           [](Activation& m) { return m(input({4, 6, 10})).sum(); });
}

// SDPA on CPU runs its flash kernel, which takes queries in blocks of 32
// rows below a length of 192 and of 64 from there. One batch of one head:
// backward allocates a row-sum buffer in each OpenMP worker, and with more
// than one (batch, head) pair the real peak depends on whether the workers
// overlap (tests/python/test_metamem.py states that case).
at::Tensor attention(std::int64_t length, bool causal) {
  auto heads_second = [length] { return input({1, length, 1, 16}).transpose(1, 2); };
  return at::scaled_dot_product_attention(heads_second(), heads_second(), heads_second(), {}, 0.0, causal).sum();
}

std::vector<LayerCase> activations() {
  return {
      activation<nn::ReLU>("relu"),
      activation<nn::ReLU6>("relu6"),
      activation<nn::LeakyReLU>("leaky_relu", nn::LeakyReLUOptions().negative_slope(0.2)),
      activation<nn::PReLU>("prelu"),
      activation<nn::PReLU>("prelu_channels", nn::PReLUOptions().num_parameters(6)),
      activation<nn::RReLU>("rrelu"),
      activation<nn::ELU>("elu"),
      activation<nn::SELU>("selu"),
      activation<nn::CELU>("celu"),
      activation<nn::GELU>("gelu"),
      activation<nn::GELU>("gelu_tanh", nn::GELUOptions().approximate("tanh")),
      activation<nn::SiLU>("silu"),
      activation<nn::Mish>("mish"),
      activation<nn::Sigmoid>("sigmoid"),
      activation<nn::Tanh>("tanh"),
      activation<nn::Hardtanh>("hardtanh"),
      activation<nn::Hardshrink>("hardshrink"),
      activation<nn::Softshrink>("softshrink"),
      activation<nn::Tanhshrink>("tanhshrink"),
      activation<nn::Threshold>("threshold", 0.1, 20.0),
      activation<nn::Softplus>("softplus"),
      activation<nn::Softsign>("softsign"),
      activation<nn::LogSigmoid>("log_sigmoid"),
      activation<nn::Softmax>("softmax", 1),
      activation<nn::LogSoftmax>("log_softmax", -1),
      activation<nn::Softmin>("softmin", 0),
      activation<nn::GLU>("glu", -1),
      function("hardsigmoid", [] { return at::hardsigmoid(input({4, 6, 10})).sum(); }),
      function("hardswish", [] { return at::hardswish(input({4, 6, 10})).sum(); }),
      layer<nn::MultiheadAttention>(
          "multihead_attention", [] { return nn::MultiheadAttention(nn::MultiheadAttentionOptions(16, 4)); },
          [](nn::MultiheadAttention& m) {
            const at::Tensor x = input({5, 3, 16});
            return std::get<0>(m(x, x, x)).sum();
          }),
      function("sdpa", [] { return attention(48, false); }),
      function("sdpa_causal_long", [] { return attention(200, true); }),
      layer<nn::TransformerEncoderLayer>(
          "transformer_encoder_layer",
          [] { return nn::TransformerEncoderLayer(nn::TransformerEncoderLayerOptions(16, 4).dim_feedforward(32)); },
          [](nn::TransformerEncoderLayer& m) { return m(input({5, 3, 16})).sum(); }),
      layer<nn::Linear>("linear", [] { return nn::Linear(16, 8); },
                        [](nn::Linear& m) { return m(input({4, 5, 16})).sum(); }),
      layer<nn::Bilinear>("bilinear", [] { return nn::Bilinear(6, 5, 4); },
                          [](nn::Bilinear& m) { return m(input({8, 6}), input({8, 5})).sum(); }),
      activation<nn::Dropout>("dropout", 0.3),
      layer<nn::Dropout2d>("dropout2d", [] { return nn::Dropout2d(0.3); },
                           [](nn::Dropout2d& m) { return m(input({4, 6, 5, 5})).sum(); }),
      layer<nn::AlphaDropout>("alpha_dropout", [] { return nn::AlphaDropout(0.3); },
                              [](nn::AlphaDropout& m) { return m(input({4, 6, 10})).sum(); }),
      function("cosine_similarity", [] { return F::cosine_similarity(input({8, 16}), input({8, 16})).sum(); }),
      function("pairwise_distance", [] { return F::pairwise_distance(input({8, 16}), input({8, 16})).sum(); }),
  };
}

INSTANTIATE_TEST_SUITE_P(Activation, Layer, ::testing::ValuesIn(activations()), case_name);

// ---- losses -------------------------------------------------------------

at::Tensor classes(std::int64_t n, at::IntArrayRef size) { return torch::randint(n, size, torch::kLong); }

std::vector<LayerCase> losses() {
  return {
      function("l1", [] { return F::l1_loss(input({8, 10}), torch::randn({8, 10})); }),
      function("mse", [] { return F::mse_loss(input({8, 10}), torch::randn({8, 10})); }),
      function("mse_sum", [] {
        return F::mse_loss(input({8, 10}), torch::randn({8, 10}), F::MSELossFuncOptions(torch::kSum));
      }),
      function("cross_entropy", [] { return F::cross_entropy(input({8, 10}), classes(10, {8})); }),
      // 2.x smooths without selecting the targets that are not ignored (1.13 read them).
      function("cross_entropy_label_smoothing", [] {
        return F::cross_entropy(input({8, 10}), classes(10, {8}), F::CrossEntropyFuncOptions().label_smoothing(0.1));
      }),
      function("cross_entropy_ignore_index_weight", [] {
        return F::cross_entropy(input({8, 10}), classes(10, {8}),
                                F::CrossEntropyFuncOptions().ignore_index(3).weight(torch::rand({10})));
      }),
      function("cross_entropy_probabilities", [] {
        return F::cross_entropy(input({8, 10}), torch::softmax(torch::randn({8, 10}), 1));
      }),
      function("cross_entropy_2d", [] { return F::cross_entropy(input({2, 5, 6, 6}), classes(5, {2, 6, 6})); }),
      function("nll_loss", [] { return F::nll_loss(input({8, 10}), classes(10, {8})); }),
      function("nll_loss_2d_ignore_index", [] {
        return F::nll_loss(input({2, 5, 6, 6}), classes(5, {2, 6, 6}), F::NLLLossFuncOptions().ignore_index(1));
      }),
      function("binary_cross_entropy", [] {
        return F::binary_cross_entropy(torch::sigmoid(input({8, 10})), torch::rand({8, 10}));
      }),
      function("binary_cross_entropy_with_logits_pos_weight", [] {
        return F::binary_cross_entropy_with_logits(
            input({8, 10}), torch::rand({8, 10}),
            F::BinaryCrossEntropyWithLogitsFuncOptions().pos_weight(torch::rand({10})));
      }),
      function("smooth_l1", [] { return F::smooth_l1_loss(input({8, 10}), torch::randn({8, 10})); }),
      function("huber", [] {
        return F::huber_loss(input({8, 10}), torch::randn({8, 10}), F::HuberLossFuncOptions().delta(0.5));
      }),
      function("kl_div", [] {
        return F::kl_div(torch::log_softmax(input({8, 10}), 1), torch::softmax(torch::randn({8, 10}), 1),
                         F::KLDivFuncOptions().reduction(torch::kBatchMean));
      }),
      function("kl_div_log_target", [] {
        return F::kl_div(torch::log_softmax(input({8, 10}), 1), torch::log_softmax(torch::randn({8, 10}), 1),
                         F::KLDivFuncOptions().log_target(true));
      }),
      function("ctc", [] {
        const at::Tensor log_probs = torch::log_softmax(input({12, 3, 6}), 2);
        return at::ctc_loss(log_probs, torch::randint(1, 6, {3, 4}, torch::kLong), {12, 12, 12}, {4, 3, 2},
                            /*blank=*/0, at::Reduction::Sum);
      }),
      // The mean divides by the target lengths, which libtorch writes into a
      // tensor through data_ptr; given as tensors, it reads them so.
      function("ctc_mean", [] {
        return at::ctc_loss(torch::log_softmax(input({12, 3, 6}), 2), torch::randint(1, 6, {3, 4}, torch::kLong),
                            {12, 12, 12}, {4, 3, 2});
      }),
      function("ctc_mean_lengths_as_tensors", [] {
        return at::ctc_loss(torch::log_softmax(input({12, 3, 6}), 2), torch::randint(1, 6, {3, 4}, torch::kLong),
                            torch::full({3}, 12, torch::kInt), torch::arange(4, 1, -1, torch::kInt));
      }),
      function("margin_ranking", [] {
        return F::margin_ranking_loss(input({8}), input({8}), torch::randn({8}).sign());
      }),
      function("hinge_embedding", [] { return F::hinge_embedding_loss(input({8, 10}), torch::randn({8, 10}).sign()); }),
      function("multilabel_margin", [] {
        return F::multilabel_margin_loss(input({4, 6}), torch::tensor({{1, 3, -1, 0, 0, 0}, {0, -1, 0, 0, 0, 0},
                                                                       {5, 4, 3, -1, 0, 0}, {2, -1, 0, 0, 0, 0}}));
      }),
      function("multilabel_soft_margin", [] {
        return F::multilabel_soft_margin_loss(input({8, 10}), torch::randint(2, {8, 10}).to(torch::kFloat));
      }),
      function("multi_margin", [] { return F::multi_margin_loss(input({8, 10}), classes(10, {8})); }),
      function("soft_margin", [] { return F::soft_margin_loss(input({8, 10}), torch::randn({8, 10}).sign()); }),
      function("cosine_embedding", [] {
        return F::cosine_embedding_loss(input({8, 16}), input({8, 16}), torch::randn({8}).sign());
      }),
      function("triplet_margin", [] { return F::triplet_margin_loss(input({8, 16}), input({8, 16}), input({8, 16})); }),
      function("poisson_nll", [] { return F::poisson_nll_loss(input({8, 10}), torch::rand({8, 10})); }),
  };
}

INSTANTIATE_TEST_SUITE_P(Loss, Layer, ::testing::ValuesIn(losses()), case_name);

// ---- data-dependent layers -------------------------------------------------

// Layers whose memory depends on tensor values stop with the op named.
struct DataDependentCase {
  LayerCase layer;
  std::string op;
};

void PrintTo(const DataDependentCase& c, std::ostream* os) { *os << c.layer.name; }

class DataDependentLayer : public ::testing::TestWithParam<DataDependentCase> {};

TEST_P(DataDependentLayer, StopsNamingTheOpThatReadsValues) {
  try {
    trace_step(GetParam().layer.build, c10::Device(c10::kCPU));
    FAIL() << "traced without an error";
  } catch (const UnsupportedOpError& e) {
    EXPECT_EQ(e.op(), GetParam().op);
    EXPECT_TRUE(e.reads_value());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Values, DataDependentLayer,
    ::testing::Values(
        // CTC's buffers are sized by its target lengths: here counted from
        // a mask too large for the trace to compute its values.
        DataDependentCase{function("ctc_lengths_from_a_mask",
                                   [] {
                                     const auto lengths = (torch::rand({3, 1 << 18}) > 0.5).sum(1).clamp(1, 4);
                                     return at::ctc_loss(torch::log_softmax(input({12, 3, 6}), 2),
                                                         torch::randint(1, 6, {3, 4}, torch::kLong),
                                                         torch::full({3}, 12, torch::kLong), lengths);
                                   }),
                          "aten::ctc_loss.Tensor"}),
    [](const ::testing::TestParamInfo<DataDependentCase>& info) { return info.param.layer.name; });

}  // namespace
}  // namespace metamem
