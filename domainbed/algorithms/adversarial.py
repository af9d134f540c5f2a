"""Adversarial feature learning: DANN and CDANN (a domain discriminator the featurizer
fools), URM (features pushed towards a uniform distribution by a discriminator against
uniform noise) and ADRMX (additive disentanglement of domain features with a remix loss),
as DomainBed implements them."""
from typing import Any

import torch
import torch.autograd as autograd
import torch.nn as nn
import torch.nn.functional as F

from domainbed import networks
from domainbed.algorithms.base import Algorithm
from domainbed.algorithms.common import (
    choice,
    concat,
    domain_labels,
    fixed,
    log_uniform,
    set_output_activation,
    uniform,
)
from domainbed.algorithms.erm import ERM
from domainbed.algorithms.optimization import make_optimizer
from domainbed.hparams import Hparam, small_or_large
from domainbed.registry import register_algorithm


def small_or_large_log_uniform(small: Any, large: Any) -> Any:
    """DomainBed's lr-like hparams: 1e-3 from 10^U(-4.5,-2.5) on small images, else 5e-5
    from 10^U(-5,-3.5)."""
    return small_or_large(log_uniform(small, -4.5, -2.5), log_uniform(large, -5, -3.5))


class AbstractDANN(Algorithm):
    """Domain-Adversarial Neural Networks (Ganin et al. 2016). Steps alternate: while
    update_count % (1 + d_steps_per_g_step) < d_steps_per_g_step the discriminator (plus a
    gradient penalty on its input) trains, otherwise the featurizer and classifier minimize
    cross-entropy minus `lambda` times the discriminator's loss. DomainBed uses alternating
    optimizers instead of the paper's gradient-reversal layer."""
    update_count: torch.Tensor
    HPARAMS = {
        "lambda": log_uniform(1.0, -2, 2, "weight of the adversarial loss"),
        "weight_decay_d": log_uniform(0.0, -6, -2, "discriminator weight decay"),
        "d_steps_per_g_step": Hparam(1, lambda r: int(2 ** r.uniform(0, 3)),
                                     "discriminator steps per generator step", low=1, high=8),
        "grad_penalty": log_uniform(0.0, -2, 1, "discriminator input-gradient penalty"),
        "beta1": choice(0.5, [0.0, 0.5], "Adam beta1 of both optimizers"),
        "mlp_width": Hparam(256, lambda r: int(2 ** r.uniform(6, 10)), low=64, high=1024),
        "mlp_depth": choice(3, [3, 4, 5]),
        "mlp_dropout": choice(0.0, [0.0, 0.1, 0.5]),
        "lr_g": small_or_large_log_uniform(1e-3, 5e-5),
        "lr_d": small_or_large_log_uniform(1e-3, 5e-5),
        "weight_decay_g": small_or_large(fixed(0.0), log_uniform(0.0, -6, -2)),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any], conditional: Any, class_balance: Any) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))
        self.conditional, self.class_balance = conditional, class_balance
        self.featurizer = networks.Featurizer(input_shape, hparams)
        self.classifier = networks.Classifier(self.featurizer.n_outputs, num_classes,
                                              hparams["nonlinear_classifier"])
        self.discriminator = networks.MLP(self.featurizer.n_outputs, num_domains, hparams)
        self.class_embeddings = nn.Embedding(num_classes, self.featurizer.n_outputs)
        betas = (hparams["beta1"], 0.9)
        self.disc_opt = make_optimizer(
            list(self.discriminator.parameters()) + list(self.class_embeddings.parameters()),
            hparams, lr=hparams["lr_d"], weight_decay=hparams["weight_decay_d"], betas=betas)
        self.gen_opt = make_optimizer(
            list(self.featurizer.parameters()) + list(self.classifier.parameters()),
            hparams, lr=hparams["lr_g"], weight_decay=hparams["weight_decay_g"], betas=betas)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        self.update_count += 1
        all_x, all_y = concat(minibatches)
        all_z = self.featurizer(all_x)
        disc_input = all_z + self.class_embeddings(all_y) if self.conditional else all_z
        disc_out = self.discriminator(disc_input)
        disc_labels = domain_labels(minibatches)
        if self.class_balance:
            y_counts = F.one_hot(all_y).sum(dim=0)
            weights = 1.0 / (y_counts[all_y] * y_counts.shape[0]).float()
            disc_loss = (weights * F.cross_entropy(disc_out, disc_labels,
                                                   reduction="none")).sum()
        else:
            disc_loss = F.cross_entropy(disc_out, disc_labels)
        input_grad = autograd.grad(F.cross_entropy(disc_out, disc_labels, reduction="sum"),
                                   [disc_input], create_graph=True)[0]
        disc_loss += self.hparams["grad_penalty"] * (input_grad ** 2).sum(dim=1).mean(dim=0)

        d_steps = self.hparams["d_steps_per_g_step"]
        if self.update_count.item() % (1 + d_steps) < d_steps:
            self.disc_opt.zero_grad()
            disc_loss.backward()
            self.disc_opt.step()
            return {"disc_loss": disc_loss.item()}
        classifier_loss = F.cross_entropy(self.classifier(all_z), all_y)
        gen_loss = classifier_loss + self.hparams["lambda"] * -disc_loss
        self.disc_opt.zero_grad()
        self.gen_opt.zero_grad()
        gen_loss.backward()
        self.gen_opt.step()
        return {"gen_loss": gen_loss.item()}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.featurizer(x))


@register_algorithm("DANN")
class DANN(AbstractDANN):
    """Unconditional DANN: the discriminator sees features only."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams,
                         conditional=False, class_balance=False)


@register_algorithm("CDANN")
class CDANN(AbstractDANN):
    """Conditional DANN (Li et al. 2018): the discriminator sees features plus a class
    embedding, and its loss is class-balanced."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams,
                         conditional=True, class_balance=True)


NOISE_RANGE = {"tanh": (-1, 1), "relu": (0, 1), "sigmoid": (0, 1)}


@register_algorithm("URM")
class URM(ERM):
    """Uniform Risk Minimization (Krishnamachari et al. 2024): the featurizer's output passes
    through a bounded activation and is made indistinguishable, for a discriminator MLP, from
    uniform noise on the activation's range; the discriminator trains after each step."""
    HPARAMS = {
        "urm": fixed("adversarial", "URM variant (only adversarial)"),
        "urm_adv_lambda": uniform(0.1, 0.0, 0.2, "weight of the adversarial loss"),
        "urm_discriminator_label_smoothing": uniform(0, 0, 0, "soft-label width", cast=float),
        "urm_discriminator_optimizer": Hparam("adam", lambda r: str(r.choice(["adam"])),
                                              "adam | sgd", choices=("adam", "sgd")),
        "urm_discriminator_hidden_layers": choice(1, [1, 2, 3]),
        "urm_generator_output": Hparam("tanh", lambda r: str(r.choice(["tanh", "relu"])),
                                       "bounded output activation",
                                       choices=("tanh", "relu", "sigmoid")),
        "urm_discriminator_lr": small_or_large(log_uniform(1e-3, -5.5, -3.5),
                                               log_uniform(5e-5, -6, -4.5)),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.discriminator = self.build_discriminator()
        lr = hparams["urm_discriminator_lr"]
        if hparams["urm_discriminator_optimizer"] == "sgd":
            self.discriminator_opt = torch.optim.SGD(
                self.discriminator.parameters(), lr=lr,
                weight_decay=hparams["weight_decay"], momentum=0.9)
        else:
            self.discriminator_opt = make_optimizer(self.discriminator.parameters(), hparams, lr=lr)
        set_output_activation(self.featurizer, hparams["urm_generator_output"])

    def build_discriminator(self) -> Any:
        model = nn.Sequential()
        model.add_module("dense1", nn.Linear(self.featurizer.n_outputs, 100))
        model.add_module("act1", nn.LeakyReLU())
        for i in range(self.hparams["urm_discriminator_hidden_layers"]):
            model.add_module(f"dense{2 + i}", nn.Linear(100, 100))
            model.add_module(f"act2{2 + i}", nn.LeakyReLU())
        model.add_module("output", nn.Linear(100, 1))
        return model

    def targets(self, n: Any, real: Any, like: Any) -> Any:
        """Discriminator targets: 1 for noise, 0 for features; with label smoothing,
        uniform soft labels within `smoothing` of them (torch.rand)."""
        smoothing = self.hparams["urm_discriminator_label_smoothing"]
        if not smoothing:
            return torch.full((n,), 1.0 if real else 0.0, dtype=like.dtype, device=like.device)
        low, high = (1 - smoothing, 1.0) if real else (0.0, smoothing)
        return (high - low) * torch.rand(n, device=like.device) + low

    def update_discriminator(self, feats: Any) -> None:
        feats = feats.detach()
        low, high = NOISE_RANGE[self.hparams["urm_generator_output"]]
        noise = (high - low) * torch.rand(feats.size(), dtype=feats.dtype,
                                          device=feats.device) + low
        noise_logits, feats_logits = self.discriminator(noise), self.discriminator(feats)
        true_y = self.targets(noise.shape[0], True, noise)
        fake_y = self.targets(feats.shape[0], False, feats)
        d_loss = (F.binary_cross_entropy_with_logits(noise_logits.squeeze(1), true_y) +
                  self.hparams["urm_adv_lambda"] *
                  F.binary_cross_entropy_with_logits(feats_logits.squeeze(1), fake_y))
        self.discriminator_opt.zero_grad()
        d_loss.backward()
        self.discriminator_opt.step()

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        all_x, all_y = concat(minibatches)
        feats = self.featurizer(all_x)
        ce_loss = F.cross_entropy(self.classifier(feats), all_y)
        true_y = torch.ones(feats.shape[0], dtype=feats.dtype, device=feats.device)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(feats).squeeze(1),
                                                    true_y)
        loss = ce_loss + self.hparams["urm_adv_lambda"] * g_loss
        self.optimizer_step(loss)
        self.update_discriminator(feats)
        return {"loss": loss.item()}


def supcon_lambda_loss(features: Any, labels: torch.Tensor, domains: torch.Tensor,
                       lamda: float = 0.5, temperature: float = 0.07) -> Any:
    """ADRMX's supervised contrastive loss: positives (same label) and negatives are
    weighted `lamda` inside the anchor's domain and 1 - `lamda` outside it
    (DomainBed's misc.SupConLossLambda)."""
    batch_size = features.shape[0]
    normalized = F.normalize(features, p=2, dim=1)
    dots = normalized @ normalized.T / temperature
    loss: Any
    loss, nans = 0, 0
    for i, (label, domain) in enumerate(zip(labels, domains)):
        same_label, same_domain = labels == label, domains == domain
        pos_in = same_label & same_domain
        pos_in[i] = False
        pos_out, neg_in = same_label & ~same_domain, ~same_label & same_domain
        neg_out = ~same_label & ~same_domain
        scaled = torch.cat((lamda * torch.exp(dots[pos_in][:, i]),
                            (1 - lamda) * torch.exp(dots[pos_out][:, i])))
        denominator = torch.sum(torch.cat((lamda * torch.exp(dots[neg_in][:, i]),
                                           (1 - lamda) * torch.exp(dots[neg_out][:, i]),
                                           scaled))) + 1e-5
        num_positives = int(pos_in.sum()) + int(pos_out.sum())
        loss_i = torch.sum(torch.log(scaled / denominator + 1e-5)) / num_positives
        if torch.isnan(loss_i):
            nans += 1
            continue
        loss -= loss_i
    return loss / (batch_size - nans + 1)


@register_algorithm("ADRMX")
class ADRMX(Algorithm):
    """ADRMX (Demirel et al. 2023): label features minus domain features give domain-
    invariant features, trained with cross-entropy, contrastive losses, a domain classifier,
    an adversarial domain discriminator and a remix loss (invariant features of one example
    plus domain features of another of the same class). Steps alternate discriminator and
    generator as DANN's."""
    update_count: torch.Tensor
    HPARAMS = {
        "cnt_lambda": choice(1.0, [1.0]), "dclf_lambda": choice(1.0, [1.0]),
        "disc_lambda": choice(0.75, [0.75]), "rmxd_lambda": choice(1.0, [1.0]),
        "d_steps_per_g_step": choice(2, [2]), "beta1": choice(0.5, [0.5]),
        "mlp_width": choice(256, [256]), "mlp_depth": choice(9, [8, 9, 10]),
        "mlp_dropout": choice(0.0, [0]),
        "lr": small_or_large(choice(3e-3, [5e-4, 1e-3, 2e-3, 3e-3]),
                             choice(3e-5, [2e-5, 3e-5, 4e-5, 5e-5])),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor([0]))
        self.num_classes, self.num_domains, self.mix_num = num_classes, num_domains, 1
        self.featurizer_label = networks.Featurizer(input_shape, hparams)
        self.featurizer_domain = networks.Featurizer(input_shape, hparams)
        n = self.featurizer_domain.n_outputs
        self.discriminator = networks.MLP(n, num_domains, hparams)
        self.classifier_label_1 = networks.Classifier(n, num_classes, is_nonlinear=True)
        self.classifier_label_2 = networks.Classifier(n, num_classes, is_nonlinear=True)
        self.classifier_domain = networks.Classifier(n, num_domains, is_nonlinear=True)
        self.network = nn.Sequential(self.featurizer_label, self.classifier_label_1)
        betas = (hparams["beta1"], 0.9)
        # DomainBed's ADRMX optimizers have no weight decay
        self.disc_opt = make_optimizer(self.discriminator.parameters(), hparams,
                                       weight_decay=0.0, betas=betas)
        self.opt = make_optimizer(
            list(self.featurizer_label.parameters()) + list(self.featurizer_domain.parameters())
            + list(self.classifier_label_1.parameters())
            + list(self.classifier_label_2.parameters())
            + list(self.classifier_domain.parameters()), hparams, weight_decay=0.0,
            betas=betas)

    def remix_loss(self, feat_combined: Any, feat_domain: Any, all_y: Any) -> Any:
        loss: Any = 0
        for i in range(self.num_classes):
            indices = torch.where(all_y == i)[0]
            for _ in range(self.mix_num):
                perm = torch.randperm(indices.numel())
                if len(perm) < 2:
                    continue
                idx1, idx2 = perm[:2]
                pred = self.classifier_label_1((feat_combined[idx1] +
                                                feat_domain[idx2]).view(1, -1))
                loss += F.cross_entropy(pred.view(1, -1), all_y[idx1].view(-1))
        return loss / (self.num_classes * self.mix_num)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        self.update_count += 1
        all_x, all_y = concat(minibatches)
        feat_label = self.featurizer_label(all_x)
        feat_domain = self.featurizer_domain(all_x)
        feat_combined = feat_label - feat_domain
        disc_labels = domain_labels(minibatches)
        disc_loss = F.cross_entropy(self.discriminator(feat_combined), disc_labels)
        d_steps = self.hparams["d_steps_per_g_step"]
        if self.update_count.item() % (1 + d_steps) < d_steps:
            self.disc_opt.zero_grad()
            disc_loss.backward()
            self.disc_opt.step()
            return {"loss_disc": disc_loss.item()}
        loss_dmn = F.cross_entropy(self.classifier_domain(feat_domain), disc_labels)
        loss_clf_int = F.cross_entropy(self.classifier_label_1(feat_label), all_y)
        loss_cnt_int = supcon_lambda_loss(feat_label, all_y, disc_labels)
        loss_clf_fin = F.cross_entropy(self.classifier_label_2(feat_combined), all_y)
        loss_cnt_fin = supcon_lambda_loss(feat_combined, all_y, disc_labels)
        loss_remixed = self.remix_loss(feat_combined, feat_domain, all_y)
        h = self.hparams
        gen_loss = (loss_clf_int + loss_clf_fin + h["dclf_lambda"] * loss_dmn +
                    h["rmxd_lambda"] * loss_remixed +
                    h["cnt_lambda"] * (loss_cnt_int + loss_cnt_fin) +
                    h["disc_lambda"] * -disc_loss)
        self.disc_opt.zero_grad()
        self.opt.zero_grad()
        gen_loss.backward()
        self.opt.step()
        as_float = float if not torch.is_tensor(loss_remixed) else (lambda t: t.item())
        return {"loss_total": gen_loss.item(), "loss_cnt_int": loss_cnt_int.item(),
                "loss_cnt_final": loss_cnt_fin.item(), "loss_clf_int": loss_clf_int.item(),
                "loss_clf_fin": loss_clf_fin.item(), "loss_dmn": loss_dmn.item(),
                "loss_disc": disc_loss.item(), "loss_remixed": as_float(loss_remixed)}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


@register_algorithm("ERDG")
class ERDG(Algorithm):
    """Domain generalization via entropy regularization (Zhao et al. 2020), benchmarked in
    OoD-Bench (Ye et al. 2022, "OoD-Bench: Quantifying and Understanding Two Dimensions of
    Out-of-Distribution Generalization"; its Table 12 gives the defaults and search ranges
    declared here).

    Four parts: featurizer F, classifier T, a domain discriminator D and one auxiliary
    classifier T'_k per training domain. Each update takes
    1. a D step on detached features (domain cross-entropy, lr `erdg_lr_d`);
    2. a T' step: each T'_k fits its own domain on detached features, its loss weighted by
       `erdg_ce_weight` (lr `erdg_lr_tprime`);
    3. an F/T step: cross-entropy of T, minus `erdg_adv_weight` times D's loss (marginal
       alignment), plus `erdg_ent_weight` times the entropy-regularization term: the
       cross-entropy of every T'_k on the other domains' examples, which is minimal when the
       class-conditional distributions of the features agree across domains (the paper's
       reading of H(Y | F(X))). F uses the run's lr, T `erdg_lr_t`.
    No reference implementation was available to us; the losses follow the paper's
    description as summarized above."""
    HPARAMS = {
        "erdg_lr_d": log_uniform(5e-5, -5, -3.5, "discriminator learning rate"),
        "erdg_lr_t": log_uniform(5e-6, -6, -4.5, "classifier (T) learning rate"),
        "erdg_lr_tprime": log_uniform(5e-6, -6, -4.5, "per-domain classifiers' learning rate"),
        "erdg_adv_weight": log_uniform(0.5, -2, 0, "weight of the adversarial loss"),
        "erdg_ent_weight": log_uniform(0.01, -4, -1, "weight of the entropy regularization"),
        "erdg_ce_weight": log_uniform(0.05, -3, -1, "weight of the per-domain cross-entropy"),
    }

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, num_domains: int,
                 hparams: dict[str, Any]) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.featurizer = networks.Featurizer(input_shape, hparams)
        n = self.featurizer.n_outputs
        nonlinear = hparams["nonlinear_classifier"]
        self.classifier = networks.Classifier(n, num_classes, nonlinear)
        self.discriminator = nn.Sequential(nn.Linear(n, n), nn.ReLU(), nn.Linear(n, num_domains))
        self.domain_classifiers = nn.ModuleList(
            [networks.Classifier(n, num_classes, nonlinear) for _ in range(num_domains)])
        self.optimizer = make_optimizer([
            {"params": self.featurizer.parameters()},
            {"params": self.classifier.parameters(), "lr": hparams["erdg_lr_t"]}], hparams)
        self.optimizer_d = make_optimizer(self.discriminator.parameters(), hparams,
                                          lr=hparams["erdg_lr_d"])
        self.optimizer_tprime = make_optimizer(self.domain_classifiers.parameters(), hparams,
                                               lr=hparams["erdg_lr_tprime"])

    def cross_domain_loss(self, features: Any, minibatches: list[tuple[torch.Tensor, ...]]) -> Any:
        """Mean cross-entropy of each domain's classifier on the other domains' examples."""
        total: Any
        total, pairs = 0.0, 0
        for k, head in enumerate(self.domain_classifiers):
            for j, (f, (_, y)) in enumerate(zip(features, minibatches)):
                if j != k:
                    total = total + F.cross_entropy(head(f), y)
                    pairs += 1
        return total / max(pairs, 1)

    def update(self, minibatches: list[tuple[torch.Tensor, ...]],
               unlabeled: list[torch.Tensor] | None = None) -> dict[str, float]:
        h = self.hparams
        all_x, all_y = concat(minibatches)
        domains = domain_labels(minibatches)
        all_f = self.featurizer(all_x)
        features = list(torch.split(all_f, [x.shape[0] for x, _ in minibatches]))

        disc_loss = F.cross_entropy(self.discriminator(all_f.detach()), domains)
        self.optimizer_d.zero_grad()
        disc_loss.backward()
        self.optimizer_d.step()

        own_loss = sum(F.cross_entropy(head(f.detach()), y) for head, f, (_, y)
                       in zip(self.domain_classifiers, features, minibatches))
        own_loss = h["erdg_ce_weight"] * own_loss / len(minibatches)
        self.optimizer_tprime.zero_grad()
        own_loss.backward()
        self.optimizer_tprime.step()

        cls_loss = F.cross_entropy(self.classifier(all_f), all_y)
        adv_loss = F.cross_entropy(self.discriminator(all_f), domains)
        ent_loss = self.cross_domain_loss(features, minibatches)
        loss = cls_loss - h["erdg_adv_weight"] * adv_loss + h["erdg_ent_weight"] * ent_loss
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        ent_loss = float(torch.as_tensor(ent_loss).detach())
        return {"loss": loss.item(), "cls_loss": cls_loss.item(), "disc_loss": disc_loss.item(),
                "tprime_loss": own_loss.item(), "ent_loss": ent_loss}

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.featurizer(x))
