"""Fetches the vendor files some tests run unchanged (AWS's NKI kernels and tests, torchvision's
RoI tests) into tests/data/vendor/<repo>@<commit>/, each pinned by commit and checked by its
SHA-256. They are public code under their own licences (MIT-0, BSD-3), kept out of this
repository. Tests read them from tests/data/vendor/ where this script fetched them, else from
../shared/vendor/ beside the checkout (the same layout and digests; CI has it): the lookup is
``VENDOR`` in tests/conftest.py. Where neither has them, the tests that need them skip,
naming this command.

    python tests/fetch_vendor.py            # needs access to github.com
"""

from __future__ import annotations

import hashlib
import pathlib
import sys
import urllib.request

VENDOR = pathlib.Path(__file__).resolve().parent / "data" / "vendor"
REPOSITORIES = {
    "aws-neuron-sdk@81ce03a": "aws-neuron/aws-neuron-sdk",
    "aws-neuron-sdk@72825d5": "aws-neuron/aws-neuron-sdk",
    "nki-samples@8370e11": "aws-neuron/nki-samples",
    # fc5c69f^, the last commit with the direct-allocation reference kernels
    "nki-samples@0898a77": "aws-neuron/nki-samples",
    "vision@00673be": "pytorch/vision",
}
# (folder, path in the repository, SHA-256 of the file at that commit, or None: the commit
# alone pins it)
FILES: list[tuple[str, str, str | None]] = [
    (
        "aws-neuron-sdk@81ce03a",
        "nki/api/nki/isa/__init__.py",
        "786dd12091aaf51085f98b0a2e1e6ec559d6235572d8a7745c7172fe004bfdf7",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/api/nki/language/__init__.py",
        "03a42daa0c672b900d5ec9f8cf85967e801d92dabb81239e08b1478a1e0bbe8f",
    ),
    ("vision@00673be", "test/test_ops.py", None),
    # read by test_ops.py at import, from its own folder
    ("vision@00673be", "test/optests_failures_dict.json", None),
    (
        "aws-neuron-sdk@81ce03a",
        "LICENSE-SAMPLECODE",
        "ddf9b5d9dd2fded18653e0ca4c5934008d4faea1161d754493b54a23c25eac14",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_activation.py",
        "414c246d4670d36e44b22213ab37e3d81cfc10a2b5abbf8bc2680d059886a1d9",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_affine_select.py",
        "28af0c553952bbd55a212cc41a705402e4d28eda52b436ab4d0755991428b77d",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_bn_stats.py",
        "b9253d4f6d668608b23f50b6eca7ce41d4d7316f7a29177d7ddd6f6815d7d608",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_copypredicated.py",
        "34749d71f024fe4650b6d7f61989602a916500008bec4e0eeb47b7a135e86731",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_dma_copy.py",
        "22bd16f121691724eccb82999597360a1b91b13f99dafeb874bb1eca9d660b0c",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_dma_transpose.py",
        "db952ce8a2bd33fcfe2f0ca4813c87f885f022e1e61c9c8428f613c5fb7ceafb",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_dropout.py",
        "03e113b8c860eb40747c26894b1c345797483f67d0fa731226e7db3e989bf6cd",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_iota.py",
        "d7c1ae745de5c882a2941889e7e2f9b6b3982c2aff1b905100f47502c724aa0c",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_local_gather.py",
        "cbe941c9268130b8d37728861c9449ee7c2475d7f4bf539cc6458ba1b3ef0974",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_max8.py",
        "2baba56e528a07ab3bc9669e8101ab2b7316905ac66babdb97c55c5f39e519e6",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_memset.py",
        "1621b04aed4bb6aadc520cc2ce144e15589c1da5ebb8ec40ca94b22b87746446",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_nc_find_index8.py",
        "5a41f515f14b22a619e3f38eee9a4a4031668b4fa62bfd34c3cd83c640ea113f",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_nc_match_replace8.py",
        "8d44633b6fc3d5a271d745d68e4c54ea4838175d3fdbe093159b43b34e4dc978",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_nc_matmul.py",
        "a979f772412f7be3d2cb67420ff8528eaef765785498200092608324923b44f6",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_nc_stream_shuffle.py",
        "83b6a0c34543d444a9f43fd162bec385ac6f5d3734897428f3fb6f4d65d0a7e4",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_nc_transpose.py",
        "4ba35985ae4cb08f7e71e1d56f5a87ce7116221ae7e922a26aaaf93778541b40",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_partition_reduce.py",
        "ea92f7bde0a102bb72548817cf9ca8543651c8c9fe523671a676a33d43eac4de",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_range_select.py",
        "c07e84325d67e49429104b131d3b3e7604ef771eb57d0313ac2566d52f6e1251",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_reciprocal.py",
        "747fda7b5eaa96f19b1abd3efba1c8e35a9cd3a24221b1057def7bbe859f368d",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_reduce.py",
        "2931931764fbef4b0d7a4551cf3ff5d858f41733c809f963b06e1090ef26625f",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_select_reduce.py",
        "32f66aa58de281f6925b3df904283427437f5f27fe3625399efebeb36d95f6a1",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_sequence_bounds.py",
        "5e5120487a3908695eba0b3a64f8446fae56f93960b4ede8b3d57a6d475435a0",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_tensor_copy.py",
        "bf267280876f517b360866f6d6f1b84327b4995cfb0eae820163af34415af038",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_tensor_scalar.py",
        "b89793dccfc4e37c6200f4ee81657be3fa121ef9ef7352532d7259eb6c678779",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_tensor_scalar_cumulative.py",
        "78630466985db8c8c5537e4de68db590fe79b76f52dd148dd9c3cefe20f8136d",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_tensor_tensor.py",
        "db7d8e438cffff971194cd684bece1fd601bc253674350bbcbefa35e3842249a",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_isa_tensor_tensor_scan.py",
        "24605aa5d4d2c4e8125b5dfcac6b1eaeb47100564e8acb12a4fc4cb6c7075611",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_mask.py",
        "2c17ea4fcba45ce7e8cec9ce169f73b7de6005229af02df0a216df176d5a8e2d",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_memory_semantics.py",
        "ecb7dd1704a481766c4ca9816ade746033e4ce564dbaf91d2e5f608e5b5cdc4c",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_add.py",
        "c2da911600d937ceb5d5883bc6a2fec841867253c9ca5534f6b52ba439bf21e9",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_broadcast.py",
        "609e0fb65e71cf0c5a8649993bd2b682bd4928729c577e1b1c75953742f79360",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_dslice.py",
        "5b9f1b9e349c7ada6dcbdf00c8eb1abf7ab8590c4aedc1634f3a4b9cf9fa8f48",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_gather_flattened.py",
        "45355a131e100a5a6d9c9f4187d9404d8c0e646d0e13f2c18616e962d71536a5",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_load_store.py",
        "c1ad5ba981324d75b787231f88e2195849a39fcd359fc648915b5a429d911821",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_load_store_indirect.py",
        "6342fa9aae193495730b0e2062a0365a2d625f2ff2de8d11a0fefadabf229eea",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_load_transpose2d.py",
        "4a6da7bcfe58c064ee8c659566b92ff7de4d5cb3b4bbdfbd5e4e826d5b1b3467",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_nl_mgrid.py",
        "6aa6fb5af88783fefd9743ef6b1a78869a5179dff5c41d197b4d51dff77ff16c",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_simulate_kernel.py",
        "e21fce99fe7f87fa4bb2d7729dcd7a460e52a48a4252909d0dfb069b9b322c83",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_nki_spmd_grid.py",
        "b10a2201679f831c37370c3bc3770be0d158ef1289bc203c196ce9f927e4b54e",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_psum_modulo_alloc.py",
        "12f58965cafe493c7ecd408808647edeb6130e66c82223b4f3413250effb2264",
    ),
    (
        "aws-neuron-sdk@81ce03a",
        "nki/test/test_sbuf_modulo_alloc.py",
        "6f2e4dc01bb045b97fadfe3ce9d6c9a26b6ef658c2e5d11b31db551445f55188",
    ),
    (  # the trn2 kernel-optimization tutorial (benchmarks/nki_estimate/trn2_tutorial.py)
        "aws-neuron-sdk@81ce03a",
        "nki/guides/tutorials/kernel-optimization.rst",
        "6d979cd6668dbd46301e3f5e05cf587c12fd64a33f3f1054edc27f55d364dfec",
    ),
    (
        "aws-neuron-sdk@72825d5",
        "LICENSE-SAMPLECODE",
        "ddf9b5d9dd2fded18653e0ca4c5934008d4faea1161d754493b54a23c25eac14",
    ),
    (
        "aws-neuron-sdk@72825d5",
        "general/nki/examples/fused_mamba/mamba_nki_kernels.py",
        "6215933e3d04cb6039c7842eac4414e84545ee674e096a8489dc7e22e57b9dca",
    ),
    (
        "aws-neuron-sdk@72825d5",
        "general/nki/examples/layernorm/layernorm_nki_kernel.py",
        "34119d221be960cef3d86607090204478db525d30ef400d5dee889ed63a8b436",
    ),
    (
        "aws-neuron-sdk@72825d5",
        "general/nki/examples/matrix_multiplication/matrix_multiplication_nki_kernels.py",
        "ad4446612baf6be2697d2a513ab02678c7fa0cdd8c65c5b7d59a20c87730b508",
    ),
    (
        "nki-samples@8370e11",
        "LICENSE",
        "0beac60c03ba4648df37840205ea1abba594a08200e2665454ff26ab65e9021c",
    ),
    (
        "nki-samples@8370e11",
        "src/nki_samples/reference/__init__.py",
        "1eb1c4ccde7e55bd4af7149fbc9c352c2b4172cc18d012854caae6a24594ad11",
    ),
    (
        "nki-samples@8370e11",
        "src/nki_samples/reference/attention.py",
        "4320a72e0a77ba8f756b904cdfb7b08a336bc1592cdca6b315ce15159d714247",
    ),
    (
        "nki-samples@8370e11",
        "src/nki_samples/reference/double_row_matmul.py",
        "9fa4538768ebe086b67eab55a8424d2e341175023a6b5406527f62316f1b3c7e",
    ),
    (
        "nki-samples@8370e11",
        "src/nki_samples/reference/vision.py",
        "8a7ac86bbdc8bf94f8fa1d75badb7496bf1a001945ba04dad05bd28c7e726766",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_SD_attention_small_head.py",
        "9e99155d96ee2906eb0b8f9e75b2bfd41a2fd5791f08cceaa4d2839a65b2644c",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_adaptive_avg_pool2d.py",
        "9b25853c092eab561f4921286439a573cea5acc2a24dfc5849acbf8997e661bd",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_double_row_matmul.py",
        "4d8c4d24e6f5848e997ea5efcc01bf2e5c63fecc8d29ff1de62acaa7bed22d70",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_flash_attn_bwd.py",
        "78fd45e1f21c03ff2bd0988beb80671a9653c208bee89e5783248d206277e374",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_flash_attn_fwd.py",
        "aa80cef109e8e57e69d6c4431973fb5d937a2310bc437964591b187b68ebe7b5",
    ),
    (
        "nki-samples@8370e11",
        "test/unit/test_resize_nearest.py",
        "e4d19b1c2d753c3a63312bfe1b6176a043bf637de6aafeba935f69dfe1ca9717",
    ),
    (
        "nki-samples@0898a77",
        "LICENSE",
        "0beac60c03ba4648df37840205ea1abba594a08200e2665454ff26ab65e9021c",
    ),
    (
        "nki-samples@0898a77",
        "src/nki_samples/reference/__init__.py",
        "1eb1c4ccde7e55bd4af7149fbc9c352c2b4172cc18d012854caae6a24594ad11",
    ),
    (
        "nki-samples@0898a77",
        "src/nki_samples/reference/allocated_attention.py",
        "929bcc0ab4d8c8595133191d635bc54d65f06f7c37a7afc6737f396fa3502526",
    ),
    (
        "nki-samples@0898a77",
        "src/nki_samples/reference/allocated_fused_linear.py",
        "a80e4379cabc7f548268e19b701eb1c1778db42958d005bc54837e27c577e446",
    ),
    (
        "nki-samples@0898a77",
        "test/unit/test_allocated_SD_attention_small_head.py",
        "e7107487c9c320dd284faa53098f288db5e197d06ed64aa6a4d188601318788d",
    ),
    (
        "nki-samples@0898a77",
        "test/unit/test_rmsnorm_qkv.py",
        "a8dac34e10542061709365bfe79fd2bf9c370b508d6c910df39a50d2190e80db",
    ),
]


def main() -> int:
    for folder, path, digest in FILES:
        target = VENDOR / folder / path
        if target.is_file() and digest in (None, hashlib.sha256(target.read_bytes()).hexdigest()):
            continue
        commit = folder.split("@")[1]
        url = f"https://github.com/{REPOSITORIES[folder]}/raw/{commit}/{path}"
        with urllib.request.urlopen(url, timeout=60) as response:
            content = response.read()
        if digest is not None and hashlib.sha256(content).hexdigest() != digest:
            print(f"{url}: not the pinned file (SHA-256 differs)", file=sys.stderr)
            return 1
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        print(f"fetched {folder}/{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
