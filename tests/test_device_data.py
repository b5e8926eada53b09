import torch

from sbcli.data.device import DeviceData, Normalization, augment, normalize, random_crop, random_flip


def test_random_crop_shifts_each_image_and_pads_with_zeros():
    gen = torch.Generator().manual_seed(0)
    images = torch.full((64, 3, 8, 8), 255, dtype=torch.uint8)
    out = random_crop(images, 2, gen)
    assert out.shape == images.shape and out.dtype == torch.uint8
    zero_counts = (out == 0).flatten(1).sum(1)
    assert (zero_counts > 0).any() and (zero_counts == 0).any()  # some shifted, some not
    # a crop is a translation: the non-zero block of every image is one rectangle of 255s
    assert set(out.unique().tolist()) <= {0, 255}


def test_crop_is_a_translation_of_the_content():
    gen = torch.Generator().manual_seed(1)
    images = torch.arange(16, dtype=torch.uint8).view(1, 1, 4, 4).repeat(32, 3, 1, 1) + 1
    out = random_crop(images, 1, gen)
    for img in out[:, 0]:
        rows = img[(img > 0).any(1)][:, (img > 0).any(0)]
        # the visible part has the same row and column steps as the original (4 and 1)
        assert torch.all(rows[:, 1:] - rows[:, :-1] == 1) and torch.all(rows[1:] - rows[:-1] == 4)


def test_flip_flips_about_half():
    gen = torch.Generator().manual_seed(0)
    images = torch.arange(4, dtype=torch.uint8).view(1, 1, 1, 4).repeat(200, 3, 4, 1)
    out = random_flip(images, gen)
    flipped = (out[:, 0, 0, 0] == 3).float().mean()
    assert 0.35 < float(flipped) < 0.65
    assert torch.equal(out[out[:, 0, 0, 0] == 0], images[out[:, 0, 0, 0] == 0])


def test_normalize_and_augment_give_float_batches():
    norm = Normalization((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    x = torch.full((2, 3, 8, 8), 255, dtype=torch.uint8)
    assert torch.allclose(normalize(x, norm), torch.full((2, 3, 8, 8), 2.0))
    out = augment(x, norm, torch.Generator().manual_seed(0))
    assert out.dtype == torch.float32 and out.shape == (2, 3, 8, 8)


def test_batches_are_a_permutation_that_drops_the_last_partial_batch():
    data = DeviceData(torch.zeros(10, 3, 4, 4, dtype=torch.uint8), torch.arange(10))
    batches = list(data.batch_indices(4, torch.Generator().manual_seed(0)))
    assert [len(b) for b in batches] == [4, 4]
    assert len(set(torch.cat(batches).tolist())) == 8
    small = list(data.batch_indices(32, torch.Generator().manual_seed(0)))
    assert [len(b) for b in small] == [10]  # fewer images than a batch: one batch of all
