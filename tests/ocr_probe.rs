use lfm::models::ocr::net::Tensor;
#[test]
fn probe() {
    let models =
        lfm::models::ocr::OcrModels::open(std::path::Path::new("samples/models/ppocr-v4")).unwrap();
    let t = std::time::Instant::now();
    let x = Tensor::F32(vec![0.1; 3 * 736 * 928], vec![1, 3, 736, 928]);
    models.det.net.run(x).unwrap();
    println!("det {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let x = Tensor::F32(vec![0.1; 3 * 48 * 1803], vec![1, 3, 48, 1803]);
    models.rec.net.run(x).unwrap();
    println!("rec 1803 {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let x = Tensor::F32(vec![0.1; 3 * 48 * 320], vec![1, 3, 48, 320]);
    models.rec.net.run(x).unwrap();
    println!("rec 320 {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let x = Tensor::F32(vec![0.1; 3 * 48 * 192], vec![1, 3, 48, 192]);
    models.cls.net.run(x).unwrap();
    println!("cls {:?}", t.elapsed());
}
