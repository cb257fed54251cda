#include "dstk/train/loss.hpp"

#include <string>

#include "dstk/enum_names.hpp"

namespace dstk::train {
namespace {

constexpr EnumNames<LossKind, 5> loss_names{{{{LossKind::ce, "ce"},
                                              {LossKind::mse, "mse"},
                                              {LossKind::poisson, "poisson"},
                                              {LossKind::poisson_exp, "poisson-exp"},
                                              {LossKind::bce, "bce"}}}};

} // namespace

LossKind parse_loss(std::string_view text, std::string_view setting) {
    return loss_names.parse(text, setting);
}

std::string_view loss_name(LossKind k) {
    return loss_names.name(k);
}

std::string loss_choices() {
    return loss_names.choices();
}

} // namespace dstk::train
