"""The timm models the sweeps take: the two smallest (by parameter count, at
most 60M) of each of timm 1.0.31's model modules, listed again from the
installed timm by pick() (about a minute and a half)."""
import torch

MODELS = [
    "halonet_h1", "eca_botnext26ts_256", "test_byobnet", "mobileone_s1", "cait_xxs24_224", "cait_xxs24_384",
    "coat_tiny", "coat_lite_tiny", "convit_tiny", "convit_small", "convmixer_768_32",
    "convmixer_1024_20_ks9_p14", "test_convnext", "test_convnext3", "cpubone_nano", "cpubone_t0",
    "crossvit_tiny_240", "crossvit_9_240", "csatv2", "csatv2_21m", "cs3darknet_focus_s", "cs3darknet_s",
    "cspnext_tiny", "cspnext_s", "davit_tiny", "davit_small", "deit_tiny_patch16_224",
    "deit_tiny_distilled_patch16_224", "densenet121", "densenetblur121d", "dla46x_c", "dla46_c", "dpn48b",
    "dpn68", "edgenext_xx_small", "edgenext_x_small", "efficientformer_l1", "efficientformer_l3",
    "efficientformerv2_s0", "efficientformerv2_s1", "test_efficientnet", "test_efficientnet_gn",
    "efficientvim_m1", "efficientvim_m1_dist", "efficientvit_b0", "efficientvit_b1", "efficientvit_m0",
    "efficientvit_m1", "vit_tiny_patch16_dinov3_qkvb", "eva02_tiny_patch14_224", "fasternet_t0", "fasternet_t1",
    "fastvit_t8", "fastvit_t12", "focalnet_tiny_srf", "focalnet_tiny_lrf", "gcvit_xxtiny", "gcvit_xtiny",
    "ghostnet_050", "ghostnetv3_050", "hardcorenas_b", "hardcorenas_a", "hgnetv2_b0", "hgnetv2_b1",
    "hiera_tiny_224", "hiera_small_abswin_256", "sam2_hiera_tiny", "sam2_hiera_small", "hrnet_w18_small",
    "hrnet_w18_small_v2", "iformer_t", "iformer_s", "inception_next_atto", "inception_next_tiny",
    "inception_resnet_v2", "inception_v3", "inception_v4", "lcnetv2_small", "lcnetv2_base", "levit_128s",
    "levit_conv_128s", "lowformer_b0", "lowformer_b1", "test_mambaout", "mambaout_femto", "test_coatnet",
    "test_maxvit", "poolformerv2_s12", "poolformer_s12", "gmlp_ti16_224", "gmixer_12_224",
    "mobilenetv3_small_050", "lcnet_035", "mobilevit_xxs", "mobilevitv2_050", "mvitv2_tiny", "mvitv2_small",
    "nest_tiny", "nest_tiny_jx", "nextvit_small", "nextvit_base", "test_nfnet", "nf_regnet_b0", "pit_ti_224",
    "pit_ti_distilled_224", "pvt_v2_b0", "pvt_v2_b1", "rdnet_tiny", "rdnet_small", "regnetx_002", "regnety_002",
    "repghostnet_050", "repghostnet_058", "repvit_m1", "repvit_m0_9", "res2next50", "res2net50_14w_8s",
    "resnest14d", "resnest26d", "test_resnet", "resnet10t", "resnetv2_18", "resnetv2_18d", "rexnet_100",
    "rexnetr_100", "selecsls42", "selecsls60", "legacy_seresnet18", "legacy_seresnext26_32x4d", "sequencer2d_s",
    "sequencer2d_m", "shvit_s1", "shvit_s2", "skresnet18", "skresnet34", "starnet_s050", "starnet_s100",
    "swiftformer_xs", "swiftformer_s", "swin_tiny_patch4_window7_224", "swin_s3_tiny_224",
    "swinv2_tiny_window16_256", "swinv2_tiny_window8_256", "swinv2_cr_tiny_224", "swinv2_cr_tiny_384",
    "tiny_vit_5m_224", "tiny_vit_11m_224", "tnt_s_legacy_patch16_224", "tnt_s_patch16_224", "tresnet_m",
    "tresnet_v2_l", "twins_svt_small", "twins_pcpvt_small", "visformer_tiny", "visformer_small", "test_vit",
    "test_vit2", "vit_tiny_r_s16_p8_224", "vit_tiny_r_s16_p8_384", "test_vit_relpos",
    "vit_srelpos_small_patch16_224", "vitamin_small_224", "volo_d1_224", "volo_d1_384", "ese_vovnet19b_slim_dw",
    "ese_vovnet19b_slim", "legacy_xception", "xception41p", "xception41", "xcit_nano_12_p8_224",
    "xcit_nano_12_p8_384"
]


def pick(per_module=2, max_params=60e6):
    import timm

    picked = []
    for module in timm.list_modules():
        sizes = []
        for name in timm.list_models(module=module):
            try:
                with torch.device("meta"):  # parameters without memory or initialisation
                    model = timm.create_model(name)
            except Exception:  # a model timm cannot build without its weights' config
                continue
            sizes.append((sum(p.numel() for p in model.parameters()), name))
        picked += [name for params, name in sorted(sizes)[:per_module] if params <= max_params]
    return picked
